#pragma once
/// The main of the Google Benchmark programs (bench/bench_*.cpp, bench/gbench_*.cu): a benchmark
/// whose check failed (State::SkipWithError) makes the program exit 1. Google Benchmark's own
/// BENCHMARK_MAIN returns 0 after such a failure, so a wrong result would read as a pass. A
/// benchmark that cannot run on this machine, which is no failure, gives an error message that
/// starts with "skipped: " (Google Benchmark 1.7 has no SkipWithMessage).
#include <benchmark/benchmark.h>

#include <cstdio>  // std::fprintf
#include <string>  // std::string
#include <vector>  // std::vector

namespace ncclkit::bench {

/// A reporter that forwards everything to another (the console's, or none: `inner` may be
/// null) and remembers the runs that ended in an error.
class CheckedReporter : public benchmark::BenchmarkReporter {
 public:
  explicit CheckedReporter(benchmark::BenchmarkReporter* inner) : inner_(inner) {}

  bool ReportContext(const Context& context) override { return inner_ == nullptr || inner_->ReportContext(context); }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (!errored(run)) continue;
      const std::string message = error_message(run);
      if (message.rfind("skipped: ", 0) == 0) {
        ++skipped_;
      } else {
        failures_.push_back(run.benchmark_name() + ": " + message);
      }
    }
    if (inner_ != nullptr) inner_->ReportRuns(runs);
  }
  void Finalize() override {
    if (inner_ != nullptr) inner_->Finalize();
  }

  /// The runs whose check failed, as "name: message".
  const std::vector<std::string>& failures() const { return failures_; }
  /// The runs that said they cannot run here ("skipped: ...").
  int skipped() const { return skipped_; }
  /// The exit code: 1 where a check failed (listed on stderr, after `program`'s name), else 0.
  int finish(const char* program) const {
    if (failures_.empty()) return 0;
    std::fprintf(stderr, "%s: FAILED: %zu benchmark run(s) failed their checks:\n", program, failures_.size());
    for (const std::string& failure : failures_) std::fprintf(stderr, "  %s\n", failure.c_str());
    return 1;
  }

 private:
  // Google Benchmark 1.7 marks a failed run with error_occurred / error_message; later versions
  // with skipped == SkippedWithError / skip_message.
  template <class R>
  static bool errored(const R& run) {
    if constexpr (requires { run.error_occurred; }) {
      return run.error_occurred;
    } else {
      using Skipped = decltype(run.skipped);  // dependent: named only where it exists
      return run.skipped == Skipped::SkippedWithError;
    }
  }
  template <class R>
  static std::string error_message(const R& run) {
    if constexpr (requires { run.error_message; }) {
      return run.error_message;
    } else {
      return run.skip_message;
    }
  }

  benchmark::BenchmarkReporter* inner_;
  std::vector<std::string> failures_;
  int skipped_ = 0;
};

/// What BENCHMARK_MAIN does, but a failed check is exit status 1.
inline int run_benchmarks(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  CheckedReporter reporter(benchmark::CreateDefaultDisplayReporter());
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return reporter.finish(argc > 0 ? argv[0] : "benchmark");
}

}  // namespace ncclkit::bench

/// BENCHMARK_MAIN() whose program exits 1 when a benchmark's check failed.
#define NCCLKIT_BENCHMARK_MAIN() \
  int main(int argc, char** argv) { return ncclkit::bench::run_benchmarks(argc, argv); }
