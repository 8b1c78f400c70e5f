// Tests of ncclkit/fusion/reducer.hpp, the bucket-reducer seam, ranks as threads over the
// loop-back backend: finish's per-bucket callback runs after its bucket's reduction and before
// the last bucket's has landed; a reducer written here, a reduce-scatter whose result lands on
// each rank's shard of every bucket (what sharded optimizer state needs), plugs into
// GradientSync as it is; a reducer that applies the optimizer update itself gets each bucket's
// update at the bucket's offsets and finish's callback learns which buckets it updated; a rank
// whose own options are invalid makes every rank fail at once, naming it, instead of leaving the
// others waiting for the timeout.
#include <doctest/doctest.h>

#include <chrono>              // std::chrono
#include <condition_variable>  // std::condition_variable
#include <cstddef>             // std::size_t
#include <memory>              // std::make_shared, std::unique_ptr
#include <mutex>               // std::mutex
#include <optional>            // std::optional
#include <span>                // std::span
#include <string>              // std::string
#include <utility>             // std::pair
#include <vector>              // std::vector

#include "ncclkit/core/update.hpp"
#include "ncclkit/fusion/gradient_sync.hpp"
#include "ncclkit/fusion/reducer.hpp"
#include "support/fusion_check.hpp"
#include "support/loopback_backend.hpp"

namespace reducer_tests {

using ncclkit::ConfigError;
using ncclkit::DataType;
using ncclkit::ReduceOp;
using ncclkit::TensorView;
using ncclkit::fusion::BucketOptions;
using ncclkit::fusion::BucketPlan;
using ncclkit::fusion::BucketRange;
using ncclkit::fusion::BucketReducer;
using ncclkit::fusion::ReducerFactory;
using ncclkit::fusion::ReducerPiece;
using ncclkit::fusion::ReducerSetup;
using ncclkit::fusion::Slot;
using ncclkit::testing::Buffer;
using ncclkit::testing::gradient;
using ncclkit::testing::LoopbackBackend;
using ncclkit::testing::LoopbackWorld;
using ncclkit::testing::message_of;
using ncclkit::testing::run_ranks;
using ncclkit::testing::small_layout;
using ncclkit::testing::Sync;
using ncclkit::testing::write_gradients;
using B = LoopbackBackend;

// The average over `ranks` of element `e` of tensor `tensor` at `step`, as the loop-back
// backend computes it: a float sum in rank order, divided by the ranks (exactly its bits).
float average(int ranks, int step, std::uint32_t tensor, std::size_t e) {
  float sum = 0;
  for (int r = 0; r < ranks; ++r) sum += static_cast<float>(gradient(r, step, tensor, e));
  return sum / static_cast<float>(ranks);
}

// The tensor and element at byte `offset` of the float32 allocation of `layout`.
std::pair<Slot, std::size_t> element_at(const ncclkit::fusion::FusedLayout& layout, std::size_t offset) {
  for (std::uint32_t i = 0; i < layout.size(); ++i) {
    const Slot slot{i};
    if (offset >= layout.offset_bytes(slot) && offset < layout.offset_bytes(slot) + layout.bytes(slot)) {
      return {slot, (offset - layout.offset_bytes(slot)) / 4};
    }
  }
  FAIL("no tensor at byte " << offset);
  return {};
}

// A one-shot gate between two threads, bounded so that a broken test fails instead of hanging.
class Gate {
 public:
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  bool wait(std::chrono::milliseconds limit) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, limit, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = false;
};

// ---- a reduce-scatter reducer: the seam's shape for sharded optimizer state -----------------

// Each bucket's whole range (a multiple of the world's size here) is reduce-scattered in place:
// rank r ends with the reduced values of shard r of it; the other shards keep its own
// gradients. `complete` makes the shard visible on the stream.
class ShardReducer final : public BucketReducer<B> {
 public:
  explicit ShardReducer(const ReducerSetup<B>& setup) : setup_(&setup) {
    for (std::size_t b = 0; b < setup.buckets.size(); ++b) {
      pieces_.push_back({b, 0, 1, setup.buckets[b].whole.bytes()});
      handed_over_.push_back(setup.backend->create_event());
      done_.push_back(setup.backend->create_event());
    }
  }
  std::string name() const override { return "reduce_scatter"; }
  std::span<const ReducerPiece> pieces() const override { return pieces_; }
  void launch(BucketRange range, Stream compute) override {
    for (std::size_t b : range) {
      setup_->backend->record(handed_over_[b], compute);
      setup_->backend->wait(handed_over_[b], setup_->comm);
      const TensorView whole = setup_->buckets[b].whole;
      setup_->backend->reduce_scatter(whole, shard(b), setup_->op, setup_->comm);
      setup_->backend->record(done_[b], setup_->comm);
    }
  }
  void complete(std::size_t bucket, Stream stream) override { setup_->backend->wait(done_[bucket], stream); }
  /// This rank's shard of bucket `b`.
  TensorView shard(std::size_t b) const {
    TensorView whole = setup_->buckets[b].whole;
    const std::size_t count = whole.count / static_cast<std::size_t>(setup_->backend->size());
    return TensorView{static_cast<float*>(whole.data) + count * static_cast<std::size_t>(setup_->backend->rank()), count,
                      whole.dtype, whole.where};
  }

 private:
  const ReducerSetup<B>* setup_;
  std::vector<ReducerPiece> pieces_;
  std::vector<LoopbackBackend::Event> handed_over_;
  std::vector<LoopbackBackend::Event> done_;
};

class ShardFactory final : public ReducerFactory<B> {
 public:
  std::string name() const override { return "reduce_scatter"; }
  std::string describe(std::span<const std::uint64_t>) const override { return "reducer reduce_scatter"; }
  std::string problem(const ReducerSetup<B>& setup) const override {
    for (const auto& bucket : setup.buckets) {
      if (bucket.whole.count % static_cast<std::size_t>(setup.backend->size()) != 0) {
        return "reduce_scatter: a bucket of " + std::to_string(bucket.whole.count) + " elements does not split into " +
               std::to_string(setup.backend->size()) + " shards";
      }
    }
    return {};
  }
  std::unique_ptr<BucketReducer<B>> make(const ReducerSetup<B>& setup) const override {
    return std::make_unique<ShardReducer>(setup);
  }
};

// ---- a reducer that applies the update itself -----------------------------------------------

// An all_reduce in place per bucket; where a step's update was set (only buckets `can` admits),
// the update then runs on the comm stream over the reduced gradients. It records what set_update
// was given, per step.
class UpdatingReducer final : public BucketReducer<B> {
 public:
  UpdatingReducer(const ReducerSetup<B>& setup, std::vector<bool> can) : setup_(&setup), can_(std::move(can)) {
    for (std::size_t b = 0; b < setup.buckets.size(); ++b) {
      pieces_.push_back({b, 0, 1, setup.buckets[b].data.bytes()});
      handed_over_.push_back(setup.backend->create_event());
      done_.push_back(setup.backend->create_event());
    }
    given_.resize(setup.buckets.size());
  }
  std::string name() const override { return "updating all_reduce"; }
  std::span<const ReducerPiece> pieces() const override { return pieces_; }
  bool can_update(std::size_t bucket) const override { return can_[bucket]; }
  void set_update(std::size_t bucket, const ncclkit::FusedUpdate& update) override {
    REQUIRE(can_[bucket]);
    given_[bucket] = update;
  }
  void launch(BucketRange range, Stream compute) override {
    B& backend = *setup_->backend;
    for (std::size_t b : range) {
      backend.record(handed_over_[b], compute);
      backend.wait(handed_over_[b], setup_->comm);
      const TensorView data = setup_->buckets[b].data;
      backend.all_reduce(data, data, setup_->op, setup_->comm);
      if (const auto& u = given_[b]) {
        const auto view = [&](float* p) { return TensorView{p, p ? data.count : 0, DataType::kFloat32, data.where}; };
        backend.update(u->rule, view(u->values), data, view(u->state0), view(u->state1),
                       TensorView{u->copy, u->copy ? data.count : 0, DataType::kBFloat16, data.where}, setup_->comm);
      }
      backend.record(done_[b], setup_->comm);
    }
  }
  void complete(std::size_t bucket, Stream stream) override { setup_->backend->wait(done_[bucket], stream); }
  void end_step(Stream) override {
    last_given_ = given_;
    given_.assign(given_.size(), std::nullopt);
  }
  /// What the last finished step's set_update calls gave, per bucket.
  const std::vector<std::optional<ncclkit::FusedUpdate>>& last_given() const { return last_given_; }

 private:
  const ReducerSetup<B>* setup_;
  std::vector<bool> can_;
  std::vector<ReducerPiece> pieces_;
  std::vector<LoopbackBackend::Event> handed_over_;
  std::vector<LoopbackBackend::Event> done_;
  std::vector<std::optional<ncclkit::FusedUpdate>> given_;
  std::vector<std::optional<ncclkit::FusedUpdate>> last_given_;
};

class UpdatingFactory final : public ReducerFactory<B> {
 public:
  explicit UpdatingFactory(std::vector<bool> can) : can_(std::move(can)) {}
  std::string name() const override { return "updating all_reduce"; }
  std::string describe(std::span<const std::uint64_t>) const override { return "reducer updating all_reduce"; }
  std::unique_ptr<BucketReducer<B>> make(const ReducerSetup<B>& setup) const override {
    return std::make_unique<UpdatingReducer>(setup, can_);
  }

 private:
  std::vector<bool> can_;
};

// Parameter `e` of tensor `tensor` before any update.
float initial_value(std::uint32_t tensor, std::size_t e) { return 1.0f + 0.01f * static_cast<float>(tensor * 64 + e); }

}  // namespace reducer_tests

using namespace reducer_tests;

TEST_CASE("finish's callback hands over each bucket after its reduction, while later buckets are still reduced") {
  constexpr int kRanks = 2;
  LoopbackWorld world(kRanks, std::chrono::seconds(5));
  Gate first_handed_over;
  std::vector<std::string> failures(kRanks);
  const auto errors = run_ranks(kRanks, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout(8));
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), ncclkit::testing::kTwoPerBucket));
    REQUIRE(sync.plan().size() == 4);
    const std::size_t last = sync.plan().size() - 1;
    write_gradients(buffer, rank, 0);
    const auto reduced = [&](std::size_t b) {
      for (Slot slot : sync.plan()[b].slots) {
        const auto values = buffer.span<float>(slot);
        for (std::size_t e = 0; e < values.size(); ++e) {
          if (values[e] != average(kRanks, 0, slot.index, e)) return false;
        }
      }
      return true;
    };
    if (rank == 1) {
      // Everything but the last bucket's tensors, then wait until rank 0 has been handed its
      // first bucket: the last bucket's reduction cannot have happened before that.
      for (Slot slot : sync.plan()[0].slots) sync.mark_ready(slot);
      for (std::size_t b = 1; b < last; ++b) {
        for (Slot slot : sync.plan()[b].slots) sync.mark_ready(slot);
      }
      if (!first_handed_over.wait(std::chrono::seconds(5))) failures[1] = "rank 0 never got its first bucket";
      for (Slot slot : sync.plan()[last].slots) sync.mark_ready(slot);
      sync.finish();
      return;
    }
    for (std::uint32_t i = 0; i < 8; ++i) sync.mark_ready(Slot{i});
    std::vector<std::size_t> order;
    sync.finish(backend.default_stream(), [&](std::size_t b) {
      order.push_back(b);
      if (!reduced(b)) failures[0] += "bucket " + std::to_string(b) + " handed over before its reduction; ";
      if (b == 0) {
        if (reduced(last)) failures[0] += "the last bucket was reduced before the first was handed over; ";
        first_handed_over.open();
      }
    });
    CHECK(order == std::vector<std::size_t>{0, 1, 2, 3});
    CHECK(reduced(last));
  });
  for (int r = 0; r < kRanks; ++r) {
    CHECK(message_of(errors[r]) == "");
    CHECK(failures[r] == "");
  }
}

TEST_CASE("a reduce-scatter reducer plugs into the seam: each rank's shard of every bucket holds the average") {
  constexpr int kRanks = 4;
  LoopbackWorld world(kRanks);
  std::vector<std::string> failures(kRanks);
  const auto errors = run_ranks(kRanks, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout(8));  // 64 floats a tensor, two a bucket: 128 a bucket
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), ncclkit::testing::kTwoPerBucket),
              {.reducer = std::make_shared<ShardFactory>()});
    CHECK(sync.reducer().name() == "reduce_scatter");
    const auto& reducer = dynamic_cast<const ShardReducer&>(sync.reducer());
    for (int step = 0; step < 2; ++step) {
      write_gradients(buffer, rank, step);
      for (Slot slot : ncclkit::testing::shuffled_slots(8, rank, step)) sync.mark_ready(slot);
      std::size_t checked = 0;
      sync.finish(backend.default_stream(), [&](std::size_t b) {
        // What a sharded optimizer would update now: this rank's shard of bucket b.
        const TensorView shard = reducer.shard(b);
        const auto* values = static_cast<const float*>(shard.data);
        const auto* base = static_cast<const float*>(buffer.data(DataType::kFloat32));
        for (std::size_t i = 0; i < shard.count; ++i) {
          const auto [slot, e] = element_at(buffer.layout(), static_cast<std::size_t>(values + i - base) * 4);
          if (values[i] != average(kRanks, step, slot.index, e)) {
            failures[rank] = "step " + std::to_string(step) + " bucket " + std::to_string(b) + ": " +
                             buffer.layout().name(slot) + "[" + std::to_string(e) + "] is not the average";
            return;
          }
        }
        ++checked;
      });
      CHECK(checked == sync.plan().size());
    }
  });
  for (int r = 0; r < kRanks; ++r) {
    CHECK(message_of(errors[r]) == "");
    CHECK(failures[r] == "");
  }
  // A plan whose buckets do not split into the ranks' shards is refused on every rank.
  LoopbackWorld three(3, std::chrono::seconds(5));
  const auto refused = run_ranks(3, [&](int rank) {
    LoopbackBackend backend(three, rank);
    Buffer buffer(backend, small_layout(8));
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), ncclkit::testing::kTwoPerBucket),
              {.reducer = std::make_shared<ShardFactory>()});
  });
  for (const auto& e : refused) CHECK(message_of(e).find("does not split into 3 shards") != std::string::npos);
}

TEST_CASE("one rank's invalid options are a ConfigError on every rank at once, naming the rank and the cause") {
  // The world's timeout is long: a rank left waiting for the invalid one would take that long.
  LoopbackWorld world(2, std::chrono::seconds(20));
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout());
    Sync sync(buffer, BucketPlan::compute(buffer.layout()), {.op = rank == 1 ? ReduceOp::kMax : ReduceOp::kAvg});
  });
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took < std::chrono::seconds(3));
  CHECK(message_of(errors[1]).find("op max is not a gradient reduction; use ReduceOp::kAvg") != std::string::npos);
  CHECK(message_of(errors[0]).find("GradientSync on rank 0: rank 1 rejected its own arguments (ncclkit: "
                                   "GradientSync: op max is not a gradient reduction") != std::string::npos);
  // The same for a plan made for another layout, and for options the reducer rejects.
  const auto other_plan = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout());
    Sync sync(buffer, BucketPlan::compute(rank == 0 ? buffer.layout() : small_layout(9)));
  });
  CHECK(message_of(other_plan[0]).find("rank 1 rejected its own arguments") != std::string::npos);
  CHECK(message_of(other_plan[1]).find("not made for this buffer's layout") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(6));
}

TEST_CASE("a reducer that updates gets each bucket's update at the bucket's offsets, and finish's callback learns which") {
  constexpr int kRanks = 2;
  LoopbackWorld world(kRanks, std::chrono::seconds(5));
  const auto errors = run_ranks(kRanks, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer gradients(backend, small_layout(8));
    Buffer values(backend, gradients.layout());
    Buffer momentum(backend, gradients.layout());
    Sync sync(gradients, BucketPlan::compute(gradients.layout(), ncclkit::testing::kTwoPerBucket),
              {.reducer = std::make_shared<UpdatingFactory>(std::vector<bool>{true, false, true, false})});
    REQUIRE(sync.plan().size() == 4);
    const auto& reducer = dynamic_cast<const UpdatingReducer&>(sync.reducer());
    for (std::uint32_t i = 0; i < 8; ++i) {
      auto v = values.span<float>(Slot{i});
      for (std::size_t e = 0; e < v.size(); ++e) v[e] = initial_value(i, e);
    }
    const ncclkit::UpdateRule rule{.lr = 0.5f, .momentum = 0.9f, .first_step = true};
    auto* base = static_cast<float*>(values.data(DataType::kFloat32));
    auto* state = static_cast<float*>(momentum.data(DataType::kFloat32));

    // Momentum needs its state buffer, and every rule the values.
    CHECK_THROWS_WITH_AS(sync.fuse_update({rule, base, nullptr, nullptr}),
                         doctest::Contains("the update's state0 is null; the rule keeps 1 state values per parameter"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(sync.fuse_update({rule, nullptr, state, nullptr}),
                         doctest::Contains("the update's values is null"), ConfigError);

    // Step 0, fused: the reducer updates buckets 0 and 2, the callback the others.
    write_gradients(gradients, rank, 0);
    sync.fuse_update({rule, base, state, nullptr});
    for (std::uint32_t i = 0; i < 8; ++i) sync.mark_ready(Slot{i});
    // Too late once a bucket has launched.
    CHECK_THROWS_WITH_AS(sync.fuse_update({rule, base, state, nullptr}),
                         doctest::Contains("call it before the step's first mark_ready"), ConfigError);
    std::vector<bool> updated;
    sync.finish(backend.default_stream(), [&](std::size_t b) {
      updated.push_back(sync.updated(b));
      if (sync.updated(b)) return;
      const auto& bucket = sync.plan()[b];
      const std::size_t first = bucket.begin_bytes / 4;
      const auto at = [&](float* p) { return TensorView{p + first, bucket.count(), DataType::kFloat32, B::memory_kind}; };
      backend.update(rule, at(base), at(static_cast<float*>(gradients.data(DataType::kFloat32))), at(state),
                     TensorView{nullptr, 0, DataType::kFloat32, B::memory_kind}, TensorView{}, backend.default_stream());
    });
    CHECK(updated == std::vector<bool>{true, false, true, false});
    for (std::size_t b = 0; b < 4; ++b) {
      const auto& given = reducer.last_given()[b];
      REQUIRE(given.has_value() == (b % 2 == 0));
      if (!given) continue;
      const std::size_t first = sync.plan()[b].begin_bytes / 4;
      CHECK(given->values == base + first);
      CHECK(given->state0 == state + first);
      CHECK(given->state1 == nullptr);
      CHECK(given->rule.lr == 0.5f);
    }
    // Every parameter took exactly one update, by whichever path: p − lr·average.
    for (std::uint32_t i = 0; i < 8; ++i) {
      const auto v = values.span<float>(Slot{i});
      for (std::size_t e = 0; e < v.size(); ++e) {
        const float g = average(kRanks, 0, i, e);
        CHECK(v[e] == initial_value(i, e) - 0.5f * g);
      }
    }

    // Step 1 without fuse_update: the reducer is given nothing, and no bucket counts as updated.
    write_gradients(gradients, rank, 1);
    for (std::uint32_t i = 0; i < 8; ++i) sync.mark_ready(Slot{i});
    std::vector<bool> updated_after;
    sync.finish(backend.default_stream(), [&](std::size_t b) { updated_after.push_back(sync.updated(b)); });
    CHECK(updated_after == std::vector<bool>(4, false));
    for (const auto& given : reducer.last_given()) CHECK_FALSE(given.has_value());
  });
  for (int r = 0; r < kRanks; ++r) CHECK(message_of(errors[r]) == "");
}

TEST_CASE("a bucket with a loose tensor is never given to the reducer to update: its values are not in the buffer") {
  constexpr int kRanks = 2;
  LoopbackWorld world(kRanks, std::chrono::seconds(5));
  const auto errors = run_ranks(kRanks, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer gradients(backend, small_layout(8));
    Buffer values(backend, gradients.layout());
    // Tensor 3 lives outside the buffer.
    std::vector<float> own(64, 0.0f);
    std::vector<void*> loose(8, nullptr);
    loose[3] = own.data();
    Sync sync(gradients, BucketPlan::compute(gradients.layout(), ncclkit::testing::kTwoPerBucket), loose,
              {.reducer = std::make_shared<UpdatingFactory>(std::vector<bool>(4, true))});
    REQUIRE(sync.plan().size() == 4);
    const auto with_loose = sync.plan().bucket_of(Slot{3});
    REQUIRE(with_loose.has_value());
    sync.fuse_update({.rule = {.lr = 0.1f}, .values = static_cast<float*>(values.data(DataType::kFloat32))});
    for (std::uint32_t i = 0; i < 8; ++i) sync.mark_ready(Slot{i});
    std::vector<bool> updated;
    sync.finish(backend.default_stream(), [&](std::size_t b) { updated.push_back(sync.updated(b)); });
    std::vector<bool> expected(4, true);
    expected[*with_loose] = false;
    CHECK(updated == expected);
  });
  for (int r = 0; r < kRanks; ++r) CHECK(message_of(errors[r]) == "");
}
