#pragma once
// Shared checks of the fusion layer's tests over the loop-back backend (ranks as threads):
// gradients as a pure function of (rank, step, tensor, element), the float64 reference, and
// check_synchronised, which runs steps in shuffled per-rank orders and compares.

#include <doctest/doctest.h>

#include <algorithm>   // std::shuffle
#include <array>       // std::array
#include <cmath>       // std::sqrt
#include <cstddef>     // std::size_t, std::byte
#include <cstdint>     // std::uint64_t
#include <functional>  // std::function
#include <optional>    // std::optional
#include <random>      // std::mt19937
#include <span>        // std::span
#include <string>      // std::string
#include <vector>      // std::vector

#include "ncclkit/compression/compressed.hpp"
#include "ncclkit/fusion/detail/byte_codec.hpp"
#include "ncclkit/fusion/gradient_sync.hpp"
#include "support/element_conversions.hpp"
#include "support/loopback_backend.hpp"
#include "support/model_shapes.hpp"

namespace ncclkit::testing {

using fusion::BucketOptions;
using fusion::BucketPlan;
using fusion::FusedLayout;
using fusion::Slot;
using Sync = fusion::GradientSync<LoopbackBackend>;
using Buffer = fusion::FusedBuffer<LoopbackBackend>;

/// A gradient value, close to N(0, 1e-3), as a pure function of (rank, step, tensor, element):
/// every thread can compute every rank's values for the reference without storing them. The
/// sum of four uniforms (16 bits each of one hash) is near normal and far cheaper than
/// Box-Muller, which matters for ResNet-50's 25.6 M values.
inline double gradient(int rank, int step, std::uint32_t tensor, std::size_t element) {
  auto mix = [](std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  const std::uint64_t h =
      mix((std::uint64_t(rank) << 56) ^ (std::uint64_t(step) << 48) ^ (std::uint64_t(tensor) << 32) ^ mix(element));
  const double sum = double(h & 0xffff) + double((h >> 16) & 0xffff) + double((h >> 32) & 0xffff) + double(h >> 48);
  // Four U(0, 1) have mean 2 and variance 1/3.
  return 1e-3 * (sum / 65536.0 - 2.0) * 1.7320508075688772;
}

using ncclkit_test::as_double;
using ncclkit_test::from_double;

/// Writes this rank's gradients of `step` into the buffer (as backward would).
inline void write_gradients(const Buffer& buffer, int rank, int step) {
  const FusedLayout& layout = buffer.layout();
  for (std::uint32_t i = 0; i < layout.size(); ++i) {
    const Slot slot{i};
    ncclkit::visit_data_type(layout.dtype(slot), [&]<class T>() {
      const auto values = buffer.span<T>(slot);
      for (std::size_t e = 0; e < values.size(); ++e) values[e] = from_double<T>(gradient(rank, step, i, e));
    });
  }
}

/// Norm-relative error ‖out − ref‖ / ‖ref‖ per element type, against the all-reduce of every
/// rank's gradients computed in float64 from the values as stored (rounded to the type).
inline std::array<double, ncclkit::fusion::kDataTypeCount> errors_against_reference(const Buffer& buffer, int ranks,
                                                                                    int step, ReduceOp op) {
  std::array<double, ncclkit::fusion::kDataTypeCount> diff{}, norm{}, error{};
  const FusedLayout& layout = buffer.layout();
  for (std::uint32_t i = 0; i < layout.size(); ++i) {
    const Slot slot{i};
    const auto t = static_cast<std::size_t>(layout.dtype(slot));
    ncclkit::visit_data_type(layout.dtype(slot), [&]<class T>() {
      const auto values = buffer.span<T>(slot);
      for (std::size_t e = 0; e < values.size(); ++e) {
        double ref = 0;
        for (int r = 0; r < ranks; ++r) ref += as_double(from_double<T>(gradient(r, step, i, e)));
        if (op == ReduceOp::kAvg) ref /= ranks;
        const double d = as_double(values[e]) - ref;
        diff[t] += d * d;
        norm[t] += ref * ref;
      }
    });
  }
  for (std::size_t t = 0; t < error.size(); ++t) error[t] = norm[t] > 0 ? std::sqrt(diff[t] / norm[t]) : 0.0;
  return error;
}

/// The tolerance of a reduced tensor of `type`: float32 ones reduced through a 16-bit codec
/// get that codec's.
inline double tolerance(DataType type, compression::Codec codec = compression::Codec::kNone) {
  if (type == DataType::kFloat32 && codec != compression::Codec::kNone) type = compression::wire_type(codec);
  switch (type) {
    case DataType::kFloat64:
      return 1e-12;
    case DataType::kFloat32:
      return 1e-6;
    case DataType::kFloat16:
      return 1e-3;
    case DataType::kBFloat16:
      return 5e-3;
    default:
      return 0;
  }
}

/// Every slot, shuffled by a seed of this rank and step: a different order on every rank.
inline std::vector<Slot> shuffled_slots(std::size_t count, int rank, int step) {
  std::vector<Slot> slots;
  for (std::uint32_t i = 0; i < count; ++i) slots.push_back(Slot{i});
  std::mt19937 random(static_cast<unsigned>(1000 * rank + step + 17));
  std::shuffle(slots.begin(), slots.end(), random);
  return slots;
}

/// FNV-1a 64 of every allocation of the buffer: equal on every rank when the ranks hold the
/// same reduced values, bit for bit.
inline std::uint64_t buffer_hash(const Buffer& buffer) {
  std::uint64_t hash = ncclkit::detail::kFnvOffsetBasis;
  for (DataType type : buffer.layout().element_types()) {
    const auto all = buffer.all(type);
    hash = ncclkit::detail::fnv1a64(std::span(static_cast<const std::byte*>(all.data), all.bytes()), hash);
  }
  return hash;
}

/// Whether `sync` reduces its compressed buckets with the fused kernel.
template <class S>
bool runs_fused(const S& sync) {
  return sync.reducer().name().find("fused") != std::string::npos;
}

/// The codec options of a sync's reducer, where it is compressed (compression::compressed).
inline std::optional<compression::CompressionOptions> compression_of(const Sync::Options& options) {
  const auto* factory = dynamic_cast<const compression::CompressedFactory<LoopbackBackend>*>(options.reducer.get());
  if (factory == nullptr) return std::nullopt;
  return factory->options();
}

/// Runs `steps` steps on `ranks` threads: write gradients, mark them in a shuffled order (a
/// different one on every rank), finish; rank 0 compares with the float64 reference and every
/// rank's result must equal rank 0's bit for bit. Also checks that events are made once, not
/// per step, and that every bucket launched before finish.
/// With `fused`, the backend offers the fused compressed reduction (CompressedReduceBackend),
/// and a sync with a codec must take it.
inline void check_synchronised(int ranks, const std::function<FusedLayout()>& make_layout, const BucketOptions& buckets,
                               int steps, Sync::Options options = {}, bool fused = false) {
  const ReduceOp op = options.op;
  const auto compressed = compression_of(options);
  const compression::Codec codec = compressed ? compressed->codec : compression::Codec::kNone;
  LoopbackWorld world(ranks);
  std::vector<std::string> failures(static_cast<std::size_t>(ranks));
  std::vector<std::vector<std::uint64_t>> hashes(static_cast<std::size_t>(ranks));
  const auto errors = run_ranks(ranks, [&](int rank) {
    LoopbackBackend backend(world, rank);
    backend.allow_compressed_reduce(fused);
    Buffer buffer(backend, make_layout());
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), buckets), options);
    const bool compress = codec != compression::Codec::kNone;
    CHECK(runs_fused(sync) == (fused && compress && compressed->fused_transfer && !compressed->rerun_nonfinite));
    const std::size_t events = backend.events_created();
    // The plain all_reduce's: per bucket, one for its hand-over and one for its completion;
    // with defer_gather one more per bucket (its second half done) and two per step.
    const std::size_t deferred = options.defer_gather ? sync.plan().size() + 2 : 0;
    if (codec == compression::Codec::kNone) CHECK(events == 2 * sync.plan().size() + deferred);
    for (int step = 0; step < steps; ++step) {
      write_gradients(buffer, rank, step);
      for (Slot slot : shuffled_slots(buffer.layout().size(), rank, step)) sync.mark_ready(slot);
      sync.finish();
      sync.wait_all(backend.default_stream());
      CHECK(sync.stats().launched_before_finish == sync.plan().size());
      CHECK(sync.nonfinite() == 0);
      hashes[static_cast<std::size_t>(rank)].push_back(buffer_hash(buffer));
      if (rank != 0) continue;
      const auto error = errors_against_reference(buffer, ranks, step, op);
      for (DataType type : buffer.layout().element_types()) {
        const double e = error[static_cast<std::size_t>(type)];
        if (!(e <= tolerance(type, codec))) {
          failures[0] += "step " + std::to_string(step) + " " + std::string(ncclkit::name_of(type)) + ": error " +
                         std::to_string(e) + "; ";
        }
      }
    }
    CHECK(backend.events_created() == events);  // reused every step
    CHECK(sync.stats().steps == static_cast<std::size_t>(steps));
  });
  for (int r = 0; r < ranks; ++r) {
    CHECK(message_of(errors[static_cast<std::size_t>(r)]) == "");
    CHECK(hashes[static_cast<std::size_t>(r)] == hashes[0]);
  }
  CHECK(hashes[0].size() == static_cast<std::size_t>(steps));
  CHECK(failures[0] == "");
}

inline FusedLayout awkward_layout() {
  FusedLayout layout;
  layout.add("embedding", {100000, 4}, DataType::kFloat32);  // one huge tensor: 1.5 MiB
  layout.add("empty.first", {0}, DataType::kFloat32);
  for (int i = 0; i < 300; ++i) {
    const DataType type = i % 7 == 0    ? DataType::kBFloat16
                          : i % 11 == 0 ? DataType::kFloat16
                          : i % 13 == 0 ? DataType::kFloat64
                                        : DataType::kFloat32;
    layout.add("tiny." + std::to_string(i), {1 + i % 17}, type);
    if (i % 50 == 0) layout.add("empty." + std::to_string(i), {3, 0}, type);
  }
  layout.add("scalar", {}, DataType::kFloat32);
  layout.finalize();
  return layout;
}

inline FusedLayout scaled_gpt2() {
  FusedLayout layout;
  for (const auto& t : ncclkit::testing::read_model_shapes("gpt2_small")) {
    std::vector<std::int64_t> shape;
    for (std::int64_t extent : t.shape) shape.push_back((extent + 7) / 8);
    layout.add(t.name, shape, DataType::kFloat32);
  }
  layout.finalize();
  return layout;
}

/// Two tensors per bucket with tiny caps: a plan of several buckets.
inline FusedLayout small_layout(int tensors = 8, bool extra = false) {
  FusedLayout layout;
  for (int i = 0; i < tensors; ++i) layout.add("w" + std::to_string(i), {64}, DataType::kFloat32);
  if (extra) layout.add("extra", {1}, DataType::kFloat32);
  layout.finalize();
  return layout;
}
const BucketOptions kTwoPerBucket{.bucket_bytes = 512, .first_bucket_bytes = 512};

}  // namespace ncclkit::testing
