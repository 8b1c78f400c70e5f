#pragma once
/// What the data-parallel trainer compares across ranks (its options and the model's layout, as
/// words), and how its state moves between the backend's memory and a checkpoint.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <bit>          // std::bit_cast
#include <cstddef>      // std::size_t, std::byte
#include <cstdint>      // std::uint64_t
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/detail/agreement.hpp"
#include "ncclkit/fusion/bucket_plan.hpp"
#include "ncclkit/fusion/detail/byte_codec.hpp"
#include "ncclkit/fusion/fused_buffer.hpp"
#include "ncclkit/trainer/checkpoint.hpp"
#include "ncclkit/trainer/options.hpp"

namespace ncclkit::trainer::detail {

/// The options every rank must share, and the model's layout, as words; their names, for the
/// message that names a difference.
inline constexpr const char* kOptionWordNames[] = {
    "another model (its layout's fingerprint)", "another global_batch", "another accumulation", "another eval_batch",
    "another codec", "another bucket_bytes", "another min_bucket_bytes", "another unused_parameters",
    "another optimizer", "another schedule", "another clip_norm", "another nonfinite", "another fuse_update",
    "another seed", "another shuffle", "another last_batch", "another log_interval", "another checkpoint_interval",
    "another choice of resuming (resume, checkpoint_folder)", "another defer_gather"};

inline std::vector<std::uint64_t> option_words(const TrainerOptions& o, const fusion::FusedLayout& layout) {
  const auto text_hash = [](const std::string& text) {
    return ncclkit::detail::fnv1a64(std::as_bytes(std::span<const char>(text.data(), text.size())));
  };
  const LrSchedule& s = o.schedule;
  ncclkit::detail::ByteWriter schedule;
  schedule.u64(std::bit_cast<std::uint64_t>(s.lr));
  schedule.u32(static_cast<std::uint32_t>(s.decay));
  schedule.u64(s.warmup_steps);
  schedule.u64(s.total_steps);
  schedule.u64(std::bit_cast<std::uint64_t>(s.min_lr));
  schedule.u64(s.step_size);
  schedule.u64(std::bit_cast<std::uint64_t>(s.gamma));
  return {fusion::BucketPlan::compute(layout).fingerprint(),
          o.global_batch,
          o.accumulation,
          o.eval_batch,
          static_cast<std::uint64_t>(o.codec),
          o.bucket_bytes,
          o.min_bucket_bytes,
          static_cast<std::uint64_t>(o.unused_parameters),
          text_hash(o.optimizer.describe()),
          ncclkit::detail::fnv1a64(std::move(schedule).take()),
          std::bit_cast<std::uint64_t>(o.clip_norm),
          static_cast<std::uint64_t>(o.nonfinite),
          static_cast<std::uint64_t>(o.fuse_update),
          o.seed,
          static_cast<std::uint64_t>(o.shuffle),
          static_cast<std::uint64_t>(o.last_batch),
          o.log_interval,
          o.checkpoint_interval,
          static_cast<std::uint64_t>(o.resume && !o.checkpoint_folder.empty()),
          static_cast<std::uint64_t>(o.defer_gather)};
}

/// "another seed (7 against 3)": what rank `rank`'s words differ from rank 0's in first.
inline std::string describe_difference(const ncclkit::detail::GatheredWords& all, int rank) {
  for (std::size_t w = 0; w < all.per_rank && w < std::size(kOptionWordNames); ++w) {
    if (all.at(rank, w) != all.at(0, w)) {
      return std::string(kOptionWordNames[w]) + " (" + std::to_string(all.at(rank, w)) + " against " +
             std::to_string(all.at(0, w)) + ")";
    }
  }
  return "other options";
}

/// The tensors of `buffer`, as the model declared them.
inline std::vector<DeclaredTensor> declared_tensors(const fusion::FusedLayout& layout) {
  std::vector<DeclaredTensor> out;
  for (std::uint32_t i = 0; i < layout.size(); ++i) {
    const fusion::Slot slot{i};
    const auto shape = layout.shape(slot);
    out.push_back({layout.name(slot), std::vector<std::int64_t>(shape.begin(), shape.end()), layout.dtype(slot)});
  }
  return out;
}

/// Copies every tensor of `buffer` to the host as `role` (synchronising `stream`).
template <Backend B>
void save_tensors(B& backend, const fusion::FusedBuffer<B>& buffer, TensorRole role, typename B::Stream stream,
                  std::vector<SavedTensor>& out) {
  const fusion::FusedLayout& layout = buffer.layout();
  const std::size_t first = out.size();
  for (std::uint32_t i = 0; i < layout.size(); ++i) {
    const fusion::Slot slot{i};
    const auto shape = layout.shape(slot);
    SavedTensor t{layout.name(slot), std::vector<std::int64_t>(shape.begin(), shape.end()), layout.dtype(slot), role,
                  std::vector<std::byte>(layout.bytes(slot))};
    out.push_back(std::move(t));
  }
  for (std::uint32_t i = 0; i < layout.size(); ++i) {
    const TensorView view = buffer.view(fusion::Slot{i});
    if (view.count > 0) backend.copy_to_host(out[first + i].bytes.data(), view.data, view.bytes(), stream);
  }
  backend.synchronize(stream);
}

/// A checkpoint of the trainer's tensors: values, optimizer state, buffers (the scalars are the
/// caller's).
template <Backend B>
CheckpointData checkpoint_of(B& backend, const fusion::FusedBuffer<B>& values,
                             const std::vector<fusion::FusedBuffer<B>>& state, const fusion::FusedBuffer<B>* buffers,
                             typename B::Stream stream) {
  CheckpointData data;
  save_tensors(backend, values, TensorRole::kValue, stream, data.tensors);
  for (std::size_t i = 0; i < state.size(); ++i) {
    save_tensors(backend, state[i], i == 0 ? TensorRole::kState0 : TensorRole::kState1, stream, data.tensors);
  }
  if (buffers != nullptr) save_tensors(backend, *buffers, TensorRole::kBuffer, stream, data.tensors);
  return data;
}

/// Why `data` cannot resume this trainer: another model, optimizer or global batch (naming the
/// first difference); empty when it can.
template <Backend B>
std::string checkpoint_problem(const CheckpointData& data, const fusion::FusedBuffer<B>& values, std::size_t states,
                               const fusion::FusedBuffer<B>* buffers, const TrainerOptions& options) {
  const std::string who = "ncclkit: DataParallelTrainer: the newest checkpoint ";
  const auto declared = declared_tensors(values.layout());
  if (std::string d = first_difference(data, TensorRole::kValue, declared); !d.empty()) {
    return who + "is of another model: " + d;
  }
  for (std::size_t i = 0; i < 2; ++i) {
    const TensorRole role = i == 0 ? TensorRole::kState0 : TensorRole::kState1;
    const auto expected = i < states ? declared : std::vector<DeclaredTensor>{};
    if (std::string d = first_difference(data, role, expected); !d.empty()) {
      return who + "holds another optimizer's state (" + data.optimizer + "; the options give " +
             options.optimizer.describe() + "): " + d;
    }
  }
  const auto buffer_tensors = buffers != nullptr ? declared_tensors(buffers->layout()) : std::vector<DeclaredTensor>{};
  if (std::string d = first_difference(data, TensorRole::kBuffer, buffer_tensors); !d.empty()) {
    return who + "is of another model (its buffers): " + d;
  }
  if (data.optimizer != options.optimizer.describe()) {
    return who + "was written with " + data.optimizer + ", the options give " + options.optimizer.describe() +
           "; resume with the optimizer it was saved with, or start in another folder";
  }
  if (data.global_batch != options.global_batch) {
    return who + "was written with a global batch of " + std::to_string(data.global_batch) + ", the options give " +
           std::to_string(options.global_batch) + "; resume with the global batch it was saved with";
  }
  return {};
}

/// Copies `data`'s tensors into the trainer's buffers (matched by role and order, which
/// checkpoint_problem has compared), on `stream`; waits for the copies.
template <Backend B>
void restore(B& backend, const CheckpointData& data, fusion::FusedBuffer<B>& values,
             std::vector<fusion::FusedBuffer<B>>& state, fusion::FusedBuffer<B>* buffers, typename B::Stream stream) {
  const auto into = [&](fusion::FusedBuffer<B>& buffer, TensorRole role) {
    std::uint32_t i = 0;
    for (const SavedTensor& t : data.tensors) {
      if (t.role != role) continue;
      const TensorView view = buffer.view(fusion::Slot{i++});
      if (view.count > 0) backend.copy_from_host(view.data, t.bytes.data(), view.bytes(), stream);
    }
  };
  into(values, TensorRole::kValue);
  for (std::size_t i = 0; i < state.size(); ++i) into(state[i], i == 0 ? TensorRole::kState0 : TensorRole::kState1);
  if (buffers != nullptr) into(*buffers, TensorRole::kBuffer);
  backend.synchronize(stream);
}

}  // namespace ncclkit::trainer::detail
