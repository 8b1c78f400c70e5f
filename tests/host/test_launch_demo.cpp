// The demo (examples/demo.cpp) under ncclkit-run, as a user restarts a job: a worker killed in
// the middle of training makes the launcher restart the group (--max-restarts 1), which goes on
// from the newest checkpoint and ends where an uninterrupted run ends. Skipped (exit 77) where
// the examples are not built (the demo needs Gloo).
// ncclkit-test: skip_code=77
#include <doctest/doctest.h>

#include <signal.h>     // kill, SIGKILL, SIGTERM
#include <sys/types.h>  // pid_t

#include <cstdio>        // std::fprintf
#include <cstdlib>       // std::_Exit
#include <filesystem>    // std::filesystem
#include <fstream>       // std::ifstream: /proc, the metrics
#include <regex>         // std::regex: the resume line
#include <string>        // std::string
#include <system_error>  // std::error_code
#include <vector>        // std::vector

#include "launch/launch_test_support.hpp"

#ifdef NCCLKIT_DEMO_EXE

namespace launch_demo_tests {

using namespace launch_test;
namespace fs = std::filesystem;

const std::string kDemo = NCCLKIT_DEMO_EXE;

// The worker of `launcher` whose environment holds RANK=`rank`, or -1.
pid_t worker_of(pid_t launcher, int rank) {
  const std::string want = "RANK=" + std::to_string(rank);
  std::error_code error;
  for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(launcher) + "/task", error)) {
    std::ifstream children(task.path() / "children");
    for (pid_t child = 0; children >> child;) {
      std::ifstream environ_file("/proc/" + std::to_string(child) + "/environ", std::ios::binary);
      for (std::string entry; std::getline(environ_file, entry, '\0');)
        if (entry == want) return child;
    }
  }
  return -1;
}

// The last line of `path` holding `kind` ("eval" or "train").
std::string last_line(const std::string& path, const std::string& kind) {
  std::ifstream in(path);
  std::string last;
  for (std::string line; std::getline(in, line);)
    if (line.find("\"kind\": \"" + kind + "\"") != std::string::npos) last = line;
  return last;
}

// Stops a launcher still running when the case ends early (a failed REQUIRE), so that it and its
// workers do not run on beside the next tests; the launcher stops its workers on SIGTERM.
struct StopsLauncher {
  Process& launcher;
  ~StopsLauncher() {
    if (launcher.status >= 0) return;
    ::kill(launcher.pid, SIGTERM);
    launcher.wait(30s);
  }
};

// A metrics line without its timing fields, which differ from run to run.
std::string without_times(std::string line) {
  return std::regex_replace(line, std::regex(", \"(samples_per_s|elapsed_s)\": [0-9.e+-]+"), "");
}

}  // namespace launch_demo_tests

using namespace launch_demo_tests;

TEST_CASE("the demo under ncclkit-run --max-restarts 1: a worker killed mid-training, the group goes on from the "
          "newest checkpoint and ends as the uninterrupted run") {
  TempDir dir;
  const auto demo = [&](const std::string& run) {
    return start({kLauncher, "--nproc-per-node", "4", "--max-restarts", "1", "--", kDemo, "--epochs", "8",
                  "--checkpoints", dir / run, "--metrics", dir / (run + ".jsonl")},
                 dir.path(), run);
  };
  Process whole = demo("whole");
  const StopsLauncher stops_whole{whole};
  REQUIRE(whole.wait(180s));
  REQUIRE_MESSAGE(whole.status == 0, whole.output());
  CHECK_FALSE(contains(whole.out(), "resuming from"));

  // Rank 3 is killed once the checkpoint of epoch 2 (22 steps an epoch) is there: 6 epochs remain.
  Process cut = demo("cut");
  const StopsLauncher stops_cut{cut};
  const auto checkpoint = dir / "cut/step-00000044.ckpt";
  REQUIRE(wait_until([&] { return fs::exists(checkpoint) || !alive(cut.pid); }, 180s));
  REQUIRE_MESSAGE(fs::exists(checkpoint), "the demo wrote no checkpoint at step 44\n", cut.output());
  const pid_t victim = worker_of(cut.pid, 3);
  REQUIRE_MESSAGE(victim > 0, "no worker with RANK=3 under the launcher; ", cut.output());
  REQUIRE(::kill(victim, SIGKILL) == 0);
  REQUIRE(cut.wait(180s));
  CHECK_MESSAGE(cut.status == 0, cut.output());
  const std::string out = cut.out();
  CHECK(contains(out + cut.err(), "restarting the worker group (restart 1 of 1)"));
  // The restarted group went on from a checkpoint of epoch 2 or later, not from the start.
  std::smatch resumed;
  REQUIRE_MESSAGE(std::regex_search(out, resumed, std::regex("resuming from .*step-([0-9]+)\\.ckpt at step ([0-9]+)")),
                  cut.output());
  CHECK(std::stoi(resumed[2].str()) >= 44);
  CHECK(std::stoi(resumed[2].str()) < 176);
  // The same test accuracy line, the same last metrics to the last printed digit.
  const std::regex accuracy("test accuracy [0-9.]+% \\([0-9]+ of [0-9]+\\) after 8 epochs, 176 steps");
  std::smatch whole_accuracy, cut_accuracy;
  const std::string whole_out = whole.out();
  REQUIRE(std::regex_search(whole_out, whole_accuracy, accuracy));
  REQUIRE(std::regex_search(out, cut_accuracy, accuracy));
  CHECK(cut_accuracy.str() == whole_accuracy.str());
  for (const std::string kind : {"train", "eval"}) {
    CAPTURE(kind);
    const std::string expected = without_times(last_line(dir / "whole.jsonl", kind));
    REQUIRE_FALSE(expected.empty());
    CHECK(without_times(last_line(dir / "cut.jsonl", kind)) == expected);
  }
}

#else

TEST_CASE("the demo under ncclkit-run --max-restarts 1 (skipped: this build has no demo)") {
  std::fprintf(stderr, "SKIPPED test_launch_demo: the demo is built with the examples and Gloo\n");
  std::fflush(stderr);
  std::_Exit(77);
}

#endif  // NCCLKIT_DEMO_EXE
