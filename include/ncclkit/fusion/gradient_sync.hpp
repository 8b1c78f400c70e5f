#pragma once
/// `GradientSync<B>`: all-reduces the gradients of a `FusedBuffer` bucket by bucket while
/// backward is still running, over any backend.
///
/// Backward marks each tensor ready as its gradient is written; a bucket of the plan is
/// launched as soon as it is complete **and every earlier bucket has been launched**, so every
/// rank issues the same collectives in the same order whatever order its gradients arrived in.
/// A launch records an event on the caller's compute stream, makes the communication stream
/// wait for it and all-reduces the bucket's range in place there: the host never waits (llm.c's
/// "we avoid having to synchronize the host"). `finish` launches what is left and makes the
/// compute stream wait for the last bucket, by an event; the optimizer step that follows on
/// that stream sees reduced gradients.
///
/// Events are made once, at construction (one per bucket and one for the end of a step), and
/// re-recorded every step.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <chrono>       // std::chrono::steady_clock
#include <cstddef>      // std::size_t, std::byte
#include <cstdint>      // std::uint64_t
#include <cstdio>       // std::snprintf
#include <exception>    // std::exception
#include <optional>     // std::optional
#include <span>         // std::span
#include <string>       // std::string, std::to_string
#include <string_view>  // std::string_view
#include <utility>      // std::move
#include <vector>       // std::vector

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/fusion/bucket_plan.hpp"
#include "ncclkit/fusion/detail/backend_memory.hpp"
#include "ncclkit/fusion/fused_buffer.hpp"
#include "ncclkit/fusion/layout.hpp"
#include "ncclkit/fusion/ready_tracker.hpp"

namespace ncclkit::fusion {

/// Options of a `GradientSync<B>`; designated initialisers:
/// `GradientSync sync(buffer, plan, {.op = ReduceOp::kSum})`.
template <Backend B>
struct GradientSyncOptions {
  /// kAvg (default: gradients of the mean loss over the global batch, as DDP gives) or kSum.
  ReduceOp op = ReduceOp::kAvg;
  /// What `finish` does about tensors never marked ready in a step (see MissingTensors).
  MissingTensors missing = MissingTensors::kError;
  /// Where buckets are reduced; the backend's `comm_stream()` when empty.
  std::optional<typename B::Stream> comm_stream = std::nullopt;
  /// Compare the plan's fingerprint, `op` and `missing` across ranks at construction (one
  /// all_gather of 16 bytes a rank) and throw ConfigError on every rank when they differ. Turn
  /// off only where every rank parsed rank 0's `serialize()`d plan already; the same on every rank.
  bool check_plan = true;
};

/// What the last finished step did.
struct GradientSyncStats {
  /// Buckets in the plan.
  std::size_t buckets = 0;
  /// Buckets launched from `mark_ready`, before `finish` was called: the overlap with backward.
  std::size_t launched_before_finish = 0;
  /// Tensors `finish` reduced as zeros (MissingTensors::kReduceAsZeros).
  std::size_t zeroed = 0;
  /// Steps finished so far.
  std::size_t steps = 0;
};

/// Host times of one bucket in a step (steady_clock), for seeing the overlap: when its last
/// tensor was marked ready (or `finish` zeroed it) and when its collective was issued. When
/// the collective ends is the comm stream's business and is not recorded here.
struct BucketTiming {
  std::chrono::steady_clock::time_point ready;
  std::chrono::steady_clock::time_point launched;
};

/// Synchronises the gradients of `buffer` along `plan`, one step at a time:
/// `mark_ready(slot)` for every tensor as backward writes it, then `finish()`.
///
/// The buffer and its backend must outlive this object. Not thread-safe: hooks that fire on
/// several threads serialise their calls. Every rank must construct it with the same plan (it
/// checks) and mark all tensors (or use kReduceAsZeros) every step.
template <Backend B>
class GradientSync {
 public:
  using Stream = typename B::Stream;
  using Event = typename B::Event;
  using Options = GradientSyncOptions<B>;

  /// Makes the events and, with `check_plan` and more than one rank, compares the plan's
  /// fingerprint (and op and missing) across ranks: a collective every rank must enter (it synchronises the comm
  /// stream once; construction is not on the hot path). ConfigError when `plan` was not made
  /// for `buffer.layout()`, for an op other than kSum and kAvg, and, on every rank, when ranks
  /// hold different plans (the message lists each rank's fingerprint).
  GradientSync(FusedBuffer<B>& buffer, BucketPlan plan, Options options = {})
      : buffer_(&buffer),
        backend_(&buffer.backend()),
        tracker_(checked(buffer, std::move(plan), options), ReadyTrackerOptions{options.missing}),
        options_(options),
        comm_(options.comm_stream.value_or(backend_->comm_stream())),
        done_event_(backend_->create_event()) {
    const std::size_t buckets = tracker_.plan().size();
    ready_events_.reserve(buckets);
    for (std::size_t b = 0; b < buckets; ++b) ready_events_.push_back(backend_->create_event());
    stats_.buckets = buckets;
    for (std::size_t b = 0; b < buckets; ++b) {
      initial_pending_.push_back(static_cast<std::uint32_t>(tracker_.plan()[b].slots.size()));
    }
    pending_ = initial_pending_;
    timings_.resize(buckets);
    last_timings_.resize(buckets);
    if (options_.missing == MissingTensors::kReduceAsZeros) {
      static const std::byte kZeros[kZeroBytes] = {};
      zeros_ = detail::Allocation<B>(*backend_, kZeroBytes);
      detail::copy_from_host(*backend_, zeros_.data(), kZeros, kZeroBytes, comm_);
      // The seed must be zero before a compute stream copies from it.
      backend_->synchronize(comm_);
    }
    if (options_.check_plan && backend_->size() > 1) agree_on_plan();
  }

  GradientSync(GradientSync&&) noexcept = default;
  GradientSync& operator=(GradientSync&&) noexcept = default;
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;
  /// After a finished step, waits for nothing: let the stream reach `finish` before freeing the
  /// buffer. A step left unfinished (an exception between `mark_ready` and `finish`) still has
  /// buckets queued that write into the buffer: the destructor waits for them on the comm
  /// stream, bounded by the backend's timeout, so that the buffer can be freed after it.
  ~GradientSync() {
    // A moved-from sync has no plan left (its vectors moved out) and owns no step.
    if (backend_ == nullptr || tracker_.plan().buckets().empty() || tracker_.launched() == 0 || tracker_.finished()) {
      return;
    }
    try {
      backend_->synchronize(comm_);
    } catch (const std::exception& e) {
      log_warn(std::string("GradientSync: the buckets of an unfinished step failed: ") + e.what());
    }
  }

  /// Records that `slot`'s gradient has been written by work issued on `stream` (the compute
  /// stream), and launches the buckets that may go now. Never blocks the host. ConfigError,
  /// naming the tensor, when it was already marked this step or the slot is out of range.
  void mark_ready(Slot slot, Stream stream) {
    const BucketRange range = tracker_.mark_ready(slot);
    if (const auto bucket = tracker_.plan().bucket_of(slot); bucket && --pending_[*bucket] == 0) {
      timings_[*bucket].ready = Clock::now();
    }
    launch(range, stream);
  }
  void mark_ready(Slot slot) { mark_ready(slot, backend_->default_stream()); }
  /// By name; ConfigError naming it when no tensor has that name.
  void mark_ready(std::string_view name, Stream stream) { mark_ready(buffer_->layout().slot(name), stream); }
  void mark_ready(std::string_view name) { mark_ready(name, backend_->default_stream()); }

  /// Ends the step: launches the buckets not launched yet, then makes `stream` wait for every
  /// bucket (one event, recorded on the comm stream after the last), and starts the next step.
  /// Never blocks the host; work issued on `stream` afterwards sees the reduced gradients.
  /// Tensors never marked: with kError (default) a ConfigError naming every one, launching
  /// nothing more (mark them and call `finish` again); with kReduceAsZeros they are filled
  /// with zeros on `stream` first, then reduced with the rest.
  void finish(Stream stream) {
    const std::size_t launched_before = tracker_.launched();
    FinishResult result = tracker_.finish();
    const auto now = Clock::now();
    for (std::size_t b : result.launch) {
      if (pending_[b] != 0) timings_[b].ready = now;
    }
    for (Slot slot : result.zeroed) {
      detail::zero_fill(*backend_, buffer_->view(slot), zeros_.data(), zeros_.bytes(), stream);
    }
    launch(result.launch, stream);
    if (!tracker_.plan().buckets().empty()) {
      backend_->record(done_event_, comm_);
      backend_->wait(done_event_, stream);
    }
    stats_.launched_before_finish = launched_before;
    stats_.zeroed = result.zeroed.size();
    ++stats_.steps;
    last_timings_.swap(timings_);
    pending_ = initial_pending_;
    tracker_.reset();
  }
  void finish() { finish(backend_->default_stream()); }

  /// The plan, in launch order.
  const BucketPlan& plan() const { return tracker_.plan(); }
  /// This step's state: what is marked, how many buckets have launched.
  const ReadyTracker& tracker() const { return tracker_; }
  /// What the last finished step did.
  const GradientSyncStats& stats() const { return stats_; }
  /// Per bucket, in plan order, when the last finished step found it ready and launched it.
  std::span<const BucketTiming> timings() const { return last_timings_; }
  const Options& options() const { return options_; }
  Stream comm_stream() const { return comm_; }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr std::size_t kZeroBytes = 4096;

  /// `plan`, once it is known to fit `buffer`'s layout and the op is one gradients use.
  static BucketPlan checked(const FusedBuffer<B>& buffer, BucketPlan plan, const Options& options) {
    if (options.op != ReduceOp::kSum && options.op != ReduceOp::kAvg) {
      throw ConfigError("ncclkit: GradientSync: op " + std::string(name_of(options.op)) +
                        " is not a gradient reduction; use ReduceOp::kAvg or ReduceOp::kSum");
    }
    try {
      (void)BucketPlan::parse(plan.serialize(), buffer.layout());
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("ncclkit: GradientSync: the plan was not made for this buffer's layout "
                                    "(make it with BucketPlan::compute(buffer.layout())): ") +
                        e.what());
    }
    return plan;
  }

  /// Launches `range` (buckets in plan order) after the work issued so far on `stream`.
  void launch(BucketRange range, Stream stream) {
    if (range.empty()) return;
    // One event covers every bucket of the range: they became launchable at the same point.
    Event& ready = ready_events_[range.first];
    backend_->record(ready, stream);
    backend_->wait(ready, comm_);
    for (std::size_t b : range) {
      const Bucket& bucket = tracker_.plan()[b];
      const TensorView all = buffer_->all(bucket.dtype);
      const TensorView view{static_cast<std::byte*>(all.data) + bucket.begin_bytes, bucket.count(), bucket.dtype,
                            B::memory_kind};
      timings_[b].launched = Clock::now();
      backend_->all_reduce(view, view, options_.op, comm_);
    }
  }

  /// All-gathers every rank's plan fingerprint and throws, on every rank alike, when they differ.
  void agree_on_plan() {
    const int ranks = backend_->size();
    // Each rank's plan fingerprint and its settings that change what a bucket computes (the
    // reduction, and whether never-marked tensors are reduced as zeros), gathered in one call.
    const std::uint64_t mine[2] = {tracker_.plan().fingerprint(), settings_code()};
    std::vector<std::uint64_t> gathered(2 * static_cast<std::size_t>(ranks));
    {
      detail::Allocation<B> in(*backend_, sizeof mine);
      detail::Allocation<B> out(*backend_, sizeof(std::uint64_t) * gathered.size());
      detail::copy_from_host(*backend_, in.data(), mine, sizeof mine, comm_);
      backend_->all_gather(TensorView{in.data(), 2, DataType::kUint64, B::memory_kind},
                           TensorView{out.data(), gathered.size(), DataType::kUint64, B::memory_kind}, comm_);
      detail::copy_to_host(*backend_, gathered.data(), out.data(), sizeof(std::uint64_t) * gathered.size(), comm_);
      backend_->synchronize(comm_);
    }
    std::vector<std::uint64_t> all(static_cast<std::size_t>(ranks));
    for (std::size_t r = 0; r < all.size(); ++r) {
      all[r] = gathered[2 * r];
      if (gathered[2 * r + 1] != gathered[1]) {
        throw ConfigError("ncclkit: GradientSync on rank " + std::to_string(backend_->rank()) + ": rank " +
                          std::to_string(r) + " uses other GradientSyncOptions than rank 0 (" +
                          describe_settings(gathered[2 * r + 1]) + " against " + describe_settings(gathered[1]) +
                          "); every rank must give the same op and missing");
      }
    }
    bool agree = true;
    for (std::uint64_t f : all) agree = agree && f == all[0];
    if (agree) return;
    const auto hex = [](std::uint64_t value) {
      char text[24];
      std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
      return std::string(text);
    };
    std::string listed;
    int shown = 0;
    for (int r = 0; r < ranks; ++r) {
      if (r != 0 && all[static_cast<std::size_t>(r)] == all[0]) continue;
      if (++shown > 8) {
        listed += ", ...";
        break;
      }
      listed +=
          (listed.empty() ? "rank " : ", rank ") + std::to_string(r) + " " + hex(all[static_cast<std::size_t>(r)]);
    }
    throw ConfigError("ncclkit: GradientSync on rank " + std::to_string(backend_->rank()) +
                      ": the ranks hold different bucket plans (fingerprints: " + listed +
                      "; ranks not listed match rank 0). This rank's plan: " + tracker_.plan().describe() +
                      ". Every rank must register the same tensors (names, shapes, element types) in the same "
                      "order and use the same LayoutOptions and BucketOptions, or parse rank 0's serialize()d plan");
  }

  std::uint64_t settings_code() const {
    return static_cast<std::uint64_t>(options_.op) << 8 | static_cast<std::uint64_t>(options_.missing);
  }
  static std::string describe_settings(std::uint64_t code) {
    const auto op = static_cast<ReduceOp>(code >> 8);
    const bool zeros = static_cast<MissingTensors>(code & 0xff) == MissingTensors::kReduceAsZeros;
    return std::string("op ") +
           (op == ReduceOp::kSum   ? "sum"
            : op == ReduceOp::kAvg ? "avg"
                                   : "other") +
           ", missing " + (zeros ? "kReduceAsZeros" : "kError");
  }

  FusedBuffer<B>* buffer_;
  B* backend_;
  ReadyTracker tracker_;
  Options options_;
  Stream comm_;
  Event done_event_;                 // recorded on the comm stream after a step's last bucket
  std::vector<Event> ready_events_;  // per bucket; a launch of several buckets uses its first's
  detail::Allocation<B> zeros_;      // kZeroBytes of zeros, for MissingTensors::kReduceAsZeros
  GradientSyncStats stats_;
  std::vector<std::uint32_t> initial_pending_;  // non-empty tensors per bucket
  std::vector<std::uint32_t> pending_;          // of those, not marked yet this step
  std::vector<BucketTiming> timings_;           // this step's
  std::vector<BucketTiming> last_timings_;      // the last finished step's
};

}  // namespace ncclkit::fusion
