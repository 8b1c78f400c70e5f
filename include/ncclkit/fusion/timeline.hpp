#pragma once
/// `Timeline`: what one rank's gradient synchronisation did and when, written as a Chrome trace
/// (JSON with "traceEvents"; open it in https://ui.perfetto.dev or chrome://tracing), so that
/// the overlap of communication with backward can be seen rather than inferred.
///
/// A trace has one process per rank (pid = rank) and three rows ("threads") in it: the host
/// thread that calls `mark_ready` and `finish`, the compute stream (where gradients are written,
/// encoded and decoded) and the comm stream (where buckets are reduced). Events are complete
/// ("X": a start and a duration) or instant ("i"). Times are the host's steady clock, shifted
/// once, at construction, onto the system clock, so that the files of ranks on several nodes line
/// up as well as the nodes' clocks do (tools/merge_timelines.py puts them in one file).
///
/// `GradientSync` fills one when `GradientSyncOptions::timeline` asks for it or NCCLKIT_TIMELINE
/// is set (which overrides the prefix, as NCCLKIT_TIMELINE_STEPS does the steps); this header is
/// the file format and its options, usable on its own.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <chrono>       // std::chrono::steady_clock, std::chrono::system_clock
#include <cstddef>      // std::size_t
#include <cstdint>      // std::int64_t, std::uint64_t, std::uint8_t
#include <optional>     // std::optional
#include <string>       // std::string, std::to_string
#include <string_view>  // std::string_view
#include <utility>      // std::move, std::pair
#include <vector>       // std::vector

#include "ncclkit/core/knobs.hpp"
#include "ncclkit/fusion/detail/chrome_trace.hpp"

namespace ncclkit::fusion {

/// Steps a timeline records unless told otherwise.
inline constexpr std::size_t kDefaultTimelineSteps = knob_default<std::size_t>("NCCLKIT_TIMELINE_STEPS");

/// Turns a GradientSync's timeline on (GradientSyncOptions::timeline).
struct TimelineOptions {
  /// Each rank writes `<prefix>.rank<R>.json` (a later GradientSync of the same process and
  /// rank: `<prefix>.rank<R>.<N>.json`, N = 1, 2, ...); the folder must exist. Empty: no timeline.
  std::string prefix;
  /// Steps recorded, from the first: the file is written once the last of them is known, and
  /// later steps cost nothing. At least 1. NCCLKIT_TIMELINE_STEPS overrides it.
  std::size_t max_steps = kDefaultTimelineSteps;
};

/// The timeline in force for a sync whose options ask for `field`: NCCLKIT_TIMELINE, when set,
/// overrides the prefix (turning the timeline on), NCCLKIT_TIMELINE_STEPS the steps; nullopt
/// when neither the options nor the environment turn it on. ConfigError naming the variable
/// for a value it cannot take.
inline std::optional<TimelineOptions> timeline_with_environment(std::optional<TimelineOptions> field) {
  std::optional<std::string> prefix = knob_text(knob("NCCLKIT_TIMELINE"));
  const std::optional<std::int64_t> steps = knob_integer(knob("NCCLKIT_TIMELINE_STEPS"));
  if (prefix) {
    if (!field) field.emplace();
    field->prefix = std::move(*prefix);
  }
  if (field && steps) field->max_steps = static_cast<std::size_t>(*steps);
  return field;
}

/// A row of the trace.
enum class TimelineLane : std::uint8_t { kHost = 0, kCompute = 1, kComm = 2 };

/// What an event is about, shown in the viewer's details of it; -1 (or 0 bytes) leaves a field
/// out.
struct TimelineArgs {
  std::int64_t step = -1;
  std::int64_t bucket = -1;
  std::int64_t chunk = -1;
  std::uint64_t bytes = 0;
};

/// One rank's events, kept in memory and written whole by `write()`. Not thread-safe.
class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  /// Events go to `path` (see TimelineOptions for how GradientSync names it), as process `rank`
  /// named "rank <rank>" followed by `label`.
  Timeline(std::string path, int rank, std::string label = {})
      : path_(std::move(path)),
        rank_(rank),
        label_(std::move(label)),
        steady_origin_(Clock::now()),
        system_origin_(std::chrono::system_clock::now()) {}

  /// An event from `start` to `end` on `lane`; `category` is a string literal ("bucket",
  /// "codec", ...), which viewers can filter by.
  void add_complete(TimelineLane lane, std::string name, const char* category, Clock::time_point start,
                    Clock::time_point end, TimelineArgs args = {}) {
    events_.push_back({std::move(name), category, lane, false, start, end, args});
  }
  /// An event at one moment.
  void add_instant(TimelineLane lane, std::string name, const char* category, Clock::time_point at,
                   TimelineArgs args = {}) {
    events_.push_back({std::move(name), category, lane, true, at, at, args});
  }
  /// A key and value for the trace's "otherData" (shown as the trace's metadata).
  void describe(std::string key, std::string value) { info_.emplace_back(std::move(key), std::move(value)); }

  /// Events recorded so far.
  std::size_t size() const { return events_.size(); }
  const std::string& path() const { return path_; }

  /// The trace: {"displayTimeUnit", "otherData", "traceEvents": [process and row names, then
  /// the events in the order they were added]}.
  std::string json() const {
    std::string out;
    out.reserve(256 + events_.size() * 160);
    out += "{\"displayTimeUnit\":\"ms\",\"otherData\":{";
    for (std::size_t i = 0; i < info_.size(); ++i) {
      if (i > 0) out.push_back(',');
      detail::append_json_string(out, info_[i].first);
      out.push_back(':');
      detail::append_json_string(out, info_[i].second);
    }
    out += "},\"traceEvents\":[\n";
    const std::string pid = std::to_string(rank_);
    const auto metadata = [&](const char* what, int tid, const char* key, const std::string& value, bool quoted) {
      out += "{\"name\":\"" + std::string(what) + "\",\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":" + std::to_string(tid) +
             ",\"args\":{\"" + key + "\":";
      if (quoted) {
        detail::append_json_string(out, value);
      } else {
        out += value;
      }
      out += "}},\n";
    };
    metadata("process_name", 0, "name", "rank " + pid + (label_.empty() ? "" : " " + label_), true);
    metadata("process_sort_index", 0, "sort_index", pid, false);
    static constexpr const char* kLaneNames[] = {"host", "compute stream", "comm stream"};
    for (int lane = 0; lane < 3; ++lane) {
      metadata("thread_name", tid(static_cast<TimelineLane>(lane)), "name", kLaneNames[lane], true);
      metadata("thread_sort_index", tid(static_cast<TimelineLane>(lane)), "sort_index", std::to_string(lane), false);
    }
    for (const Event& e : events_) {
      out += "{\"name\":";
      detail::append_json_string(out, e.name);
      out += ",\"cat\":";
      detail::append_json_string(out, e.category);
      out += e.instant ? ",\"ph\":\"i\",\"s\":\"t\"" : ",\"ph\":\"X\"";
      out += ",\"pid\":" + pid + ",\"tid\":" + std::to_string(tid(e.lane)) + ",\"ts\":";
      detail::append_microseconds(out, system_nanoseconds(e.start));
      if (!e.instant) {
        out += ",\"dur\":";
        detail::append_microseconds(out, std::chrono::duration_cast<std::chrono::nanoseconds>(e.end - e.start).count());
      }
      out += ",\"args\":{";
      bool first = true;
      const auto field = [&](const char* key, std::int64_t value, bool present) {
        if (!present) return;
        out += (first ? "\"" : ",\"") + std::string(key) + "\":" + std::to_string(value);
        first = false;
      };
      field("step", e.args.step, e.args.step >= 0);
      field("bucket", e.args.bucket, e.args.bucket >= 0);
      field("chunk", e.args.chunk, e.args.chunk >= 0);
      field("bytes", static_cast<std::int64_t>(e.args.bytes), e.args.bytes > 0);
      out += "}},\n";
    }
    out.resize(out.size() - 2);  // the last ",\n": there is always a metadata event before it
    out += "\n]}\n";
    return out;
  }

  /// Writes `json()` to `path()`, replacing it whole (never half a file). ConfigError naming
  /// the path and the reason when it cannot.
  void write() const {
    detail::write_file_whole(path_, json(),
                             "point NCCLKIT_TIMELINE (or TimelineOptions::prefix) into a folder that exists and is "
                             "writable");
  }

 private:
  struct Event {
    std::string name;
    const char* category;
    TimelineLane lane;
    bool instant;
    Clock::time_point start;
    Clock::time_point end;
    TimelineArgs args;
  };

  static int tid(TimelineLane lane) { return static_cast<int>(lane) + 1; }
  /// Nanoseconds since the Unix epoch, by the offset taken at construction.
  std::int64_t system_nanoseconds(Clock::time_point t) const {
    using std::chrono::duration_cast;
    using std::chrono::nanoseconds;
    return duration_cast<nanoseconds>(system_origin_.time_since_epoch()).count() +
           duration_cast<nanoseconds>(t - steady_origin_).count();
  }

  std::string path_;
  int rank_;
  std::string label_;
  Clock::time_point steady_origin_;
  std::chrono::system_clock::time_point system_origin_;
  std::vector<Event> events_;
  std::vector<std::pair<std::string, std::string>> info_;
};

}  // namespace ncclkit::fusion
