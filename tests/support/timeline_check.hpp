#pragma once
// Checks of a GradientSync timeline file (fusion/timeline.hpp) shared by the loop-back, Gloo
// and GPU tests: the file is one JSON document in Chrome's trace format, and for every recorded
// step and bucket it holds what the docs promise, in an order that causality requires.

#include <algorithm>  // std::max
#include <cmath>      // std::abs
#include <cstddef>    // std::size_t
#include <map>        // std::map
#include <set>        // std::set
#include <string>     // std::string
#include <tuple>      // std::tuple
#include <vector>     // std::vector

#include "support/json_value.hpp"
#include "support/text.hpp"

namespace ncclkit_test {

/// What a trace must hold.
struct TraceExpectation {
  int rank = 0;
  std::size_t buckets = 0;
  std::size_t steps = 0;       ///< steps recorded (numbered 0..steps-1), no more
  bool codec = false;          ///< every bucket is float32 and encoded
  std::size_t chunks_per_bucket = 1;
  bool loose = false;  ///< every bucket has loose tensors
  bool gathered = false;  ///< every bucket in two halves (defer_gather): an all_gather after its all_reduce
};

/// One event of a trace, as read back.
struct TraceEvent {
  std::string name;
  std::string phase;
  int tid = 0;
  double ts = 0;
  double dur = 0;
  long step = -1;
};

/// The trace's events other than metadata; throws std::runtime_error when the file is not a
/// trace (not JSON, no traceEvents, an event without its fields, another pid).
inline std::vector<TraceEvent> read_trace(const std::string& path, int rank) {
  const JsonValue document = parse_json(read_text(path));
  const JsonValue& events = document["traceEvents"];
  if (events.kind != JsonValue::Kind::kArray) throw std::runtime_error("traceEvents is not an array");
  std::vector<TraceEvent> out;
  for (const JsonValue& e : events.array) {
    if (e["pid"].number != rank) throw std::runtime_error("an event of pid " + std::to_string(e["pid"].number));
    const std::string phase = e["ph"].string;
    if (phase == "M") continue;
    if (phase != "X" && phase != "i") throw std::runtime_error("an event of phase \"" + phase + "\"");
    TraceEvent event{e["name"].string, phase, static_cast<int>(e["tid"].number), e["ts"].number, 0, -1};
    if (phase == "X") {
      event.dur = e["dur"].number;
      if (event.dur < 0) throw std::runtime_error(event.name + " has a negative duration");
    }
    if (e["args"].has("step")) event.step = static_cast<long>(e["args"]["step"].number);
    if (event.tid < 1 || event.tid > 3) throw std::runtime_error(event.name + " on tid " + std::to_string(event.tid));
    out.push_back(event);
  }
  return out;
}

/// Times are microseconds since 1970 in a double, so sums and comparisons of them hold to a
/// fraction of a microsecond (0.25 us is the double's step there), not to the nanosecond.
inline constexpr double kSlack = 1.0;

/// What is wrong with the trace at `path` against `want`; empty when nothing is.
inline std::string trace_problems(const std::string& path, const TraceExpectation& want) {
  std::vector<TraceEvent> events;
  try {
    events = read_trace(path, want.rank);
  } catch (const std::exception& e) {
    return path + ": " + e.what();
  }
  // (step, name) -> event; every name must be there once a step.
  std::map<std::pair<long, std::string>, TraceEvent> by_name;
  std::set<long> steps;
  std::string problems;
  const auto problem = [&](const std::string& text) { problems += text + "; "; };
  for (const TraceEvent& e : events) {
    if (e.step < 0) problem(e.name + " has no step");
    steps.insert(e.step);
    if (!by_name.emplace(std::pair(e.step, e.name), e).second)
      problem(e.name + " twice in step " + std::to_string(e.step));
  }
  if (steps.size() != want.steps ||
      (!steps.empty() && (*steps.begin() != 0 || *steps.rbegin() != long(want.steps) - 1))) {
    problem("steps " + std::to_string(steps.size()) + " recorded, not " + std::to_string(want.steps));
  }
  const auto find = [&](long step, const std::string& name, const std::string& phase, int tid) -> const TraceEvent* {
    auto it = by_name.find({step, name});
    if (it == by_name.end()) {
      problem("step " + std::to_string(step) + " has no \"" + name + "\"");
      return nullptr;
    }
    if (it->second.phase != phase || it->second.tid != tid) {
      problem(name + " is " + it->second.phase + " on tid " + std::to_string(it->second.tid) + ", not " + phase +
              " on " + std::to_string(tid));
    }
    return &it->second;
  };
  for (long s = 0; s < long(want.steps); ++s) {
    const TraceEvent* step = find(s, "step " + std::to_string(s), "X", 1);
    const TraceEvent* finish = find(s, "finish", "X", 1);
    if (step && finish && finish->ts + finish->dur > step->ts + step->dur + kSlack)
      problem("finish ends after its step");
    find(s, "backward", "X", 2);
    for (std::size_t b = 0; b < want.buckets; ++b) {
      const std::string id = "b" + std::to_string(b);
      const TraceEvent* ready = find(s, "ready " + id, "i", 1);
      const TraceEvent* launch = find(s, "launch " + id, "i", 1);
      if (ready && launch && !(ready->ts <= launch->ts)) problem("ready " + id + " after its launch");
      find(s, "gradients " + id, "i", 2);
      double last_end = -1;
      for (std::size_t c = 0; c < want.chunks_per_bucket; ++c) {
        const std::string piece = want.chunks_per_bucket > 1 ? id + "." + std::to_string(c) : id;
        const TraceEvent* reduce = find(s, "all_reduce " + piece, "X", 3);
        if (!reduce) continue;
        last_end = std::max(last_end, reduce->ts + reduce->dur);
        if (!want.codec) continue;
        const TraceEvent* encode = find(s, "encode " + piece, "X", 2);
        const TraceEvent* decode = find(s, "decode " + piece, "X", 2);
        // Stream order: the comm stream waits for the encode, the decode waits for the reduction.
        if (encode && encode->ts + encode->dur > reduce->ts + kSlack)
          problem("encode " + piece + " ends after its all_reduce starts");
        if (decode && reduce->ts + reduce->dur > decode->ts + kSlack)
          problem("decode " + piece + " starts before its all_reduce ends");
      }
      if (want.gathered) {
        const TraceEvent* gather = find(s, "all_gather " + id, "X", 3);
        if (gather && last_end >= 0 && gather->ts + kSlack < last_end) {
          problem("all_gather " + id + " starts before its all_reduce ends");
        }
        if (gather) last_end = std::max(last_end, gather->ts + gather->dur);
      }
      const TraceEvent* done = find(s, "done " + id, "i", 3);
      if (done && last_end >= 0 && std::abs(done->ts - last_end) > kSlack)
        problem("done " + id + " is not its last all_reduce's end");
      if (want.loose) {
        find(s, "pack " + id, "X", 2);
        find(s, "unpack " + id, "X", 2);
      }
    }
  }
  return problems;
}

}  // namespace ncclkit_test
