#pragma once
/// `SyncTimeline<B>`: the observer (fusion/observer.hpp) that records a `GradientSync`'s
/// timeline (fusion/timeline.hpp), and when it reads the backend's timings.
///
/// Host times (a bucket ready, launched; `finish`) are read from the steady clock as they
/// happen. Work on the streams (gradients, pack, encode, all_reduce, count, rerun, decode,
/// unpack) is bracketed by the backend's timing events, made once at construction: two sets,
/// used by alternate steps, so that step k's events are read in step k+1's `finish` (the host
/// waits there for step k's work, if it is not done yet) while step k+1 records into the other
/// set; the last recorded step is read at once.
///
/// Device times are placed on the host clock by one anchor: a timing event recorded on the comm
/// stream while it is idle, whose host time is taken when the record returns (within a few
/// microseconds of when the GPU reaches it). Each step's events are read relative to the step's
/// first event, so that cudaEventElapsedTime's float keeps sub-microsecond steps within a step.

#include <algorithm>  // std::fill
#include <array>      // std::array
#include <chrono>     // std::chrono
#include <cstddef>    // std::size_t
#include <cstdint>    // std::uint8_t, std::int64_t
#include <exception>  // std::exception
#include <map>        // std::map
#include <memory>     // std::unique_ptr
#include <mutex>      // std::mutex, std::lock_guard
#include <optional>   // std::optional
#include <span>       // std::span
#include <string>     // std::string, std::to_string
#include <utility>    // std::move
#include <vector>     // std::vector

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/fusion/bucket_plan.hpp"
#include "ncclkit/fusion/observer.hpp"
#include "ncclkit/fusion/reducer.hpp"
#include "ncclkit/fusion/timeline.hpp"

namespace ncclkit::fusion::detail {

/// `<prefix>.rank<R>.json` for the first timeline of a prefix and rank in this process,
/// `<prefix>.rank<R>.<N>.json` for the N-th after it, so that several GradientSyncs (a
/// benchmark's rows) do not overwrite each other's files.
inline std::string timeline_path(const std::string& prefix, int rank) {
  static std::mutex mutex;
  static std::map<std::string, int> made;
  const std::string base = prefix + ".rank" + std::to_string(rank);
  int n = 0;
  {
    std::lock_guard lock(mutex);
    n = made[base]++;
  }
  return base + (n == 0 ? "" : "." + std::to_string(n)) + ".json";
}

/// When the host reached the points of a step that are not on a stream.
struct HostTimes {
  std::chrono::steady_clock::time_point first_mark{};
  std::chrono::steady_clock::time_point finish_begin{};
};

template <Backend B>
class SyncTimeline final : public SyncObserver<B> {
 public:
  using Stream = typename B::Stream;
  using Event = typename B::Event;
  using Clock = std::chrono::steady_clock;

  /// Why `options` cannot record, or empty.
  static std::string problem(const TimelineOptions& options) {
    return options.max_steps < 1 ? "ncclkit: GradientSync: TimelineOptions::max_steps is 0; record at least 1 step"
                                 : std::string();
  }

  /// A timeline for a sync with `plan` whose reducer issues `pieces` and marks `piece_phases`
  /// (BucketReducer), with loose tensors to pack and unpack or not (`loose`), or null when its
  /// file cannot be written (a warning says so, naming the path): a trace must never stop
  /// training. `label` names the sync in the trace. `options` must have passed `problem`.
  static std::unique_ptr<SyncTimeline> make(B& backend, const TimelineOptions& options, const BucketPlan& plan,
                                            std::span<const ReducerPiece> pieces, std::uint32_t piece_phases,
                                            bool loose, const std::string& label) {
    Timeline trace(timeline_path(options.prefix, backend.rank()), backend.rank(), label);
    try {
      trace.write();  // an empty trace now: a bad path is reported before training, not after it
    } catch (const std::exception& e) {
      log_warn(std::string(e.what()) + "; this rank records no timeline");
      return nullptr;
    }
    return std::unique_ptr<SyncTimeline>(
        new SyncTimeline(backend, std::move(trace), options.max_steps, plan, pieces, piece_phases, loose));
  }

  SyncTimeline(const SyncTimeline&) = delete;
  SyncTimeline& operator=(const SyncTimeline&) = delete;
  ~SyncTimeline() = default;

  const Timeline& trace() const { return trace_; }

  /// Records the anchor on `idle`, a stream with nothing queued.
  void anchor(Stream idle) {
    backend_->record(anchor_, idle);
    anchor_host_ = Clock::now();
  }

  /// Whether this step is recorded.
  bool recording() const { return !broken_ && step_ < max_steps_; }

  /// At every mark_ready: the first of a step records the step's reference on `stream`.
  void on_mark(Stream stream) override {
    if (!recording() || started_) return;
    start_step(stream);
    marked_ = true;
  }

  /// Brackets work on `stream`: `end` false before it, true after it (instants: before only).
  void on_phase(Phase phase, std::size_t index, bool end, Stream stream) override {
    if (!recording()) return;
    Set& set = sets_[current()];
    const auto p = static_cast<std::size_t>(phase);
    if (index >= set.done[p].size()) return;  // a phase this sync was not prepared for
    backend_->record(end ? set.end[p][index] : set.begin[p][index], stream);
    if (end || phase == Phase::kReady) set.done[p][index] = 1;
  }

  /// At the start of `finish(stream)` (every call: a call that throws for missing tensors is
  /// followed by another).
  void on_finish_begin(Stream stream) override {
    if (!recording()) return;
    if (!started_) start_step(stream);
    sets_[current()].host.finish_begin = Clock::now();
    on_phase(Phase::kBackward, 0, true, stream);
  }

  /// At the end of a `finish` that completed the step, whose buckets' host times are `timings`
  /// (BucketTiming: ready, launched). Reads the previous step's timings, and this one's too when
  /// it is the last recorded, then writes the file.
  void on_finish_end(std::span<const BucketTiming> timings) override {
    if (!recording()) return;
    Set& set = sets_[current()];
    const auto end = Clock::now();
    const auto step = static_cast<std::int64_t>(step_);
    trace_.add_complete(TimelineLane::kHost, "step " + std::to_string(step), "step",
                        marked_ ? set.host.first_mark : set.host.finish_begin, end, {.step = step});
    trace_.add_complete(TimelineLane::kHost, "finish", "step", set.host.finish_begin, end, {.step = step});
    for (std::size_t b = 0; b < timings.size(); ++b) {
      const TimelineArgs args{.step = step, .bucket = static_cast<std::int64_t>(b), .bytes = bucket_bytes_[b]};
      trace_.add_instant(TimelineLane::kHost, "ready b" + std::to_string(b), "bucket", timings[b].ready, args);
      trace_.add_instant(TimelineLane::kHost, "launch b" + std::to_string(b), "bucket", timings[b].launched, args);
    }
    set.had_marks = marked_;
    set.step = step_;
    set.pending = true;
    started_ = false;
    marked_ = false;
    ++step_;
    read(sets_[current()]);  // the step before this one
    if (step_ == max_steps_) {
      read(set);
      write();
    }
  }

  /// Reads what is left and writes the file, unless nothing changed since it was last written.
  /// Waits for the last finished step's work. Never throws: a failure is a warning.
  void flush() noexcept override {
    read(sets_[0]);
    read(sets_[1]);
    if (trace_.size() != written_) write();
  }

 private:
  /// Timing events of one step: begin and end per phase and index, and which ends were recorded.
  struct Set {
    std::array<std::vector<Event>, kPhaseCount> begin;
    std::array<std::vector<Event>, kPhaseCount> end;
    std::array<std::vector<std::uint8_t>, kPhaseCount> done;
    HostTimes host;
    std::size_t step = 0;
    bool had_marks = false;
    bool pending = false;  // finished, not read yet
  };

  SyncTimeline(B& backend, Timeline trace, std::size_t max_steps, const BucketPlan& plan,
               std::span<const ReducerPiece> pieces, std::uint32_t piece_phases, bool loose)
      : backend_(&backend), trace_(std::move(trace)), max_steps_(max_steps) {
    for (std::size_t b = 0; b < plan.size(); ++b) bucket_bytes_.push_back(plan[b].bytes());
    pieces_.assign(pieces.begin(), pieces.end());
    trace_.describe("ncclkit", "GradientSync timeline");
    trace_.describe("plan", plan.describe());
    trace_.describe("steps recorded", std::to_string(max_steps_));
    trace_.describe("device timings", "timing events, read one step late");
    std::array<std::size_t, kPhaseCount> counts{};
    for (std::size_t p = 0; p < kPhaseCount; ++p) {
      if (piece_phases >> p & 1u) counts[p] = pieces_.size();
    }
    counts[static_cast<std::size_t>(Phase::kBackward)] = 1;
    counts[static_cast<std::size_t>(Phase::kReady)] = plan.size();
    counts[static_cast<std::size_t>(Phase::kPack)] = loose ? plan.size() : 0;
    counts[static_cast<std::size_t>(Phase::kUnpack)] = loose ? plan.size() : 0;
    anchor_ = backend.create_timing_event();
    for (Set& set : sets_) {
      for (std::size_t p = 0; p < kPhaseCount; ++p) {
        for (std::size_t i = 0; i < counts[p]; ++i) {
          set.begin[p].push_back(backend.create_timing_event());
          if (p != static_cast<std::size_t>(Phase::kReady)) set.end[p].push_back(backend.create_timing_event());
        }
        set.done[p].assign(counts[p], 0);
      }
    }
  }

  std::size_t current() const { return step_ % 2; }

  void start_step(Stream stream) {
    started_ = true;
    Set& set = sets_[current()];
    for (auto& flags : set.done) std::fill(flags.begin(), flags.end(), std::uint8_t{0});
    set.host.first_mark = Clock::now();
    on_phase(Phase::kBackward, 0, false, stream);
  }

  /// Turns a finished step's events into trace events; waits for its work. A failure (the
  /// communicator failed, say) stops the timeline with a warning; what it holds is kept.
  void read(Set& set) noexcept {
    if (!set.pending) return;
    set.pending = false;
    try {
      read_device(set);
    } catch (const std::exception& e) {
      broken_ = true;
      log_warn("ncclkit: timeline " + trace_.path() + ": reading the stream timings of step " +
               std::to_string(set.step) + " failed (" + e.what() +
               "); no more steps are recorded, the file keeps the steps before");
    }
  }

  void read_device(Set& set) {
    using std::chrono::duration;
    using std::chrono::duration_cast;
    const auto backward = static_cast<std::size_t>(Phase::kBackward);
    const Event& reference = set.begin[backward][0];
    const auto to_host = [](double ms) { return duration_cast<Clock::duration>(duration<double, std::milli>(ms)); };
    const Clock::time_point base = anchor_host_ + to_host(backend_->elapsed_ms(anchor_, reference));
    const auto at = [&](const Event& e) { return base + to_host(backend_->elapsed_ms(reference, e)); };
    const auto step = static_cast<std::int64_t>(set.step);
    if (set.had_marks) {
      trace_.add_complete(TimelineLane::kCompute, "backward", "step", base, at(set.end[backward][0]), {.step = step});
    }
    std::vector<std::optional<Clock::time_point>> bucket_done(bucket_bytes_.size());
    for (std::size_t p = 0; p < kPhaseCount; ++p) {
      const auto phase = static_cast<Phase>(p);
      if (phase == Phase::kBackward) continue;
      const bool per_bucket = phase == Phase::kReady || phase == Phase::kPack || phase == Phase::kUnpack;
      for (std::size_t i = 0; i < set.done[p].size(); ++i) {
        if (set.done[p][i] == 0) continue;
        const std::size_t bucket = per_bucket ? i : pieces_[i].bucket;
        const bool chunked = !per_bucket && pieces_[i].chunks > 1;
        const std::string name = std::string(kNames[p]) + " b" + std::to_string(bucket) +
                                 (chunked ? "." + std::to_string(pieces_[i].chunk) : "");
        TimelineArgs args{.step = step,
                          .bucket = static_cast<std::int64_t>(bucket),
                          .chunk = chunked ? static_cast<std::int64_t>(pieces_[i].chunk) : -1,
                          .bytes = per_bucket ? bucket_bytes_[bucket] : pieces_[i].bytes};
        const Clock::time_point start = at(set.begin[p][i]);
        if (phase == Phase::kReady) {
          trace_.add_instant(TimelineLane::kCompute, name, "bucket", start, args);
          continue;
        }
        const Clock::time_point end = at(set.end[p][i]);
        const bool on_comm = phase == Phase::kReduce || phase == Phase::kRerun || phase == Phase::kGather;
        trace_.add_complete(on_comm ? TimelineLane::kComm : TimelineLane::kCompute, name, kCategories[p], start, end,
                            args);
        if (on_comm && (!bucket_done[bucket] || *bucket_done[bucket] < end)) bucket_done[bucket] = end;
      }
    }
    for (std::size_t b = 0; b < bucket_done.size(); ++b) {
      if (!bucket_done[b]) continue;
      trace_.add_instant(TimelineLane::kComm, "done b" + std::to_string(b), "bucket", *bucket_done[b],
                         {.step = step, .bucket = static_cast<std::int64_t>(b), .bytes = bucket_bytes_[b]});
    }
  }

  void write() noexcept {
    try {
      trace_.write();
      written_ = trace_.size();
    } catch (const std::exception& e) {
      written_ = trace_.size();  // one warning per change, not one per attempt
      log_warn(e.what());
    }
  }

  static constexpr const char* kNames[kPhaseCount] = {"backward", "gradients", "pack",   "encode", "all_reduce",
                                                      "count",    "rerun",     "decode", "unpack", "all_gather"};
  static constexpr const char* kCategories[kPhaseCount] = {"step",  "bucket", "loose", "codec", "bucket",
                                                           "codec", "codec",  "codec", "loose", "bucket"};

  B* backend_;
  Timeline trace_;
  std::size_t max_steps_;
  std::vector<std::uint64_t> bucket_bytes_;  // per bucket
  std::vector<ReducerPiece> pieces_;         // the reducer's
  std::array<Set, 2> sets_;
  Event anchor_{};
  Clock::time_point anchor_host_{};
  std::size_t step_ = 0;     // steps finished so far
  bool started_ = false;     // this step's reference is recorded
  bool marked_ = false;      // this step had a mark_ready
  bool broken_ = false;      // reading timings failed: record no more
  std::size_t written_ = 0;  // trace events in the file
};

}  // namespace ncclkit::fusion::detail
