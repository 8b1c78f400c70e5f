// scripts/gpu-run.sh's bookkeeping, through its --dry-run (every phase faked, no GPU): a run
// that leaves a selected phase out (cut by the time budget, exit 77, too few GPUs, a name that
// is no phase) ends non-zero and says INCOMPLETE, naming it; phases left out on purpose
// (GPU_RUN_PHASES, another set) do not; a failure, a phase's own timeout or a test phase with no
// test case fails the run; every set holds only phases of its machine; the test phases get
// NCCLKIT_TEST_REQUIRE_GPUS from the GPUs they see; the trainer benchmark's phases see as many
// GPUs as their world has.
#include <doctest/doctest.h>

#include <filesystem>  // std::filesystem::path
#include <string>      // std::string

#include "support/run_shell.hpp"
#include "support/temp_dir.hpp"
#include "support/text.hpp"

namespace {

using ncclkit_test::contains;
using ncclkit_test::ShellRun;

const std::string kScript = (std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "scripts" / "gpu-run.sh")
                                .lexically_normal()
                                .string();

/// Runs `scripts/gpu-run.sh run --dry-run` with `settings` ("NAME=value ..." for env) in a clean
/// environment, into a folder of its own. Its output: the phases it would run, then the summary.
ShellRun dry_run(const std::string& settings) {
  ncclkit_test::TempDir out("gpu-run");
  return ncclkit_test::run_shell("env -i PATH=\"$PATH\" " + settings + " bash '" + kScript + "' run --dry-run '" +
                                 out.path + "/out'");
}

/// The line of `text` that starts with `prefix` ("" when none).
std::string line_of(const std::string& text, const std::string& prefix) {
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = text.find('\n', at);
    const std::string line = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    if (line.rfind(prefix, 0) == 0) return line;
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return "";
}

}  // namespace

TEST_CASE("every set passes a dry run on 2 and 4 GPUs: its phases exist there and nothing is left out") {
  for (const char* gpus : {"2", "4"}) {
    for (const char* set : {"tests", "tests-a", "tests-b", "perf", "fusion-bench", "copy-sweep", "mlp-bench"}) {
      CAPTURE(gpus);
      CAPTURE(set);
      const ShellRun run = dry_run(std::string("GPU_RUN_FAKE_GPUS=") + gpus + " GPU_RUN_SET=" + set);
      CHECK_MESSAGE(run.status == 0, run.output);
      CHECK(contains(run.output, "PASSED: every selected phase ran and passed"));
      CHECK_FALSE(contains(run.output, "INCOMPLETE"));
    }
  }
}

TEST_CASE("the default set is the tests, and test phases require the GPUs they see") {
  const ShellRun run = dry_run("GPU_RUN_FAKE_GPUS=4");
  CHECK(run.status == 0);
  CHECK(contains(line_of(run.output, "GPUs used:"), "set tests: check communicator-4gpu"));
  CHECK(
      contains(line_of(run.output, "fusion-test (limit"), "CUDA_VISIBLE_DEVICES=0,1,2,3 NCCLKIT_TEST_REQUIRE_GPUS=4"));
  CHECK(contains(line_of(run.output, "codec-test (limit"), "CUDA_VISIBLE_DEVICES=0 NCCLKIT_TEST_REQUIRE_GPUS=1"));
  CHECK(contains(line_of(run.output, "communicator-2gpu (limit"), "NCCLKIT_TEST_REQUIRE_GPUS=2"));
  // The worlds of the grouped path and the network transport follow the GPUs there are.
  CHECK(contains(line_of(run.output, "collectives-grouped (limit"), "NCCLKIT_TEST_WORLD_SIZES=2,4"));
  CHECK(contains(line_of(run.output, "collectives-grouped (limit"), "NCCLKIT_TEST_COLLECTIVE_PATH=grouped"));
  CHECK(contains(line_of(run.output, "collectives-net (limit"), "NCCLKIT_TEST_COLLECTIVE_PATH=native"));
  const ShellRun two = dry_run("GPU_RUN_FAKE_GPUS=2");
  CHECK(contains(line_of(two.output, "collectives-grouped (limit"), "NCCLKIT_TEST_WORLD_SIZES=2 "));
  // Nothing decides the fused kernel's requirement from PyTorch's presence.
  CHECK_FALSE(contains(run.output, "REQUIRE_FUSED"));
}

TEST_CASE("the mlp-bench set runs train_mlp and PyTorch's DDP at 1 and 2 GPUs, and at 4 where there are 4") {
  const ShellRun two = dry_run("GPU_RUN_FAKE_GPUS=2 GPU_RUN_SET=mlp-bench");
  CHECK(two.status == 0);
  CHECK(contains(line_of(two.output, "GPUs used:"),
                 "train-mlp-p1 torch-mlp-p1 train-mlp-p2 train-mlp-defer-p2 torch-mlp-p2 split-step-p2; budget"));
  CHECK(contains(line_of(two.output, "split-step-p2 (limit"), "CUDA_VISIBLE_DEVICES=0,1 "));
  CHECK(contains(line_of(two.output, "split-step-p2 (limit"), "bench_split_step 64,256 198"));
  // float32 gradients in two halves: their own row, against ncclkit's 1-GPU step.
  CHECK(contains(line_of(two.output, "train-mlp-defer-p2 (limit"), "--codec none --defer-gather --label defer"));
  CHECK(contains(line_of(two.output, "train-mlp-p1 (limit"), "CUDA_VISIBLE_DEVICES=0 "));
  CHECK(contains(line_of(two.output, "train-mlp-p1 (limit"), "--nprocs 1 --depth 8 --width 4096 --batch 64,256"));
  CHECK(contains(line_of(two.output, "train-mlp-p2 (limit"), "CUDA_VISIBLE_DEVICES=0,1 "));
  CHECK(contains(line_of(two.output, "train-mlp-p2 (limit"), "--codec none,fp16"));
  CHECK(contains(line_of(two.output, "torch-mlp-p2 (limit"), "ddp_mlp_bench.py --nprocs 2 --depth 8 --width 4096"));
  const ShellRun four = dry_run("GPU_RUN_FAKE_GPUS=4 GPU_RUN_SET=mlp-bench");
  CHECK(four.status == 0);
  CHECK(contains(line_of(four.output, "train-mlp-p4 (limit"), "CUDA_VISIBLE_DEVICES=0,1,2,3 "));
  CHECK(contains(line_of(four.output, "torch-mlp-p4 (limit"), "--nprocs 4"));
  CHECK(contains(line_of(four.output, "train-mlp-defer-p4 (limit"), "CUDA_VISIBLE_DEVICES=0,1,2,3 "));
}

TEST_CASE("a phase that exits 77 leaves the run INCOMPLETE, naming it, with exit status 3") {
  const ShellRun run = dry_run("GPU_RUN_FAKE='large-1gib=77'");
  CHECK(run.status == 3);
  CHECK(contains(run.output, "INCOMPLETE: 1 selected phase(s) did not run:"));
  CHECK(contains(run.output, "  large-1gib: skipped (exit 77"));
  CHECK_FALSE(contains(run.output, "PASSED"));
}

TEST_CASE("phases the time budget cuts, before or while they run, leave the run INCOMPLETE") {
  // communicator-4gpu takes 90 s of a 100 s budget: with less than 15 s left, every later
  // phase is cut before it starts.
  const ShellRun before = dry_run("GPU_RUN_BUDGET=100 GPU_RUN_FAKE='communicator-4gpu=0@90'");
  CHECK(before.status == 3);
  CHECK(contains(before.output, "  collectives-4gpu: cut by the time budget (91 s of 100 s used)"));
  CHECK(contains(before.output, "  fused-memcheck: cut by the time budget"));
  // It would take 150 s: it gets the 99 s left, and is cut then (not a failure of its own).
  const ShellRun during = dry_run("GPU_RUN_BUDGET=100 GPU_RUN_FAKE='communicator-4gpu=0@150'");
  CHECK(during.status == 3);
  CHECK(contains(during.output, "  communicator-4gpu: cut by the time budget after 99 s"));
  CHECK_FALSE(contains(during.output, "FAILED"));
}

TEST_CASE("phases left out on purpose by GPU_RUN_PHASES are no failure; a name that is no phase here is") {
  const ShellRun chosen = dry_run("GPU_RUN_PHASES='check large-1gib'");
  CHECK(chosen.status == 0);
  CHECK(contains(chosen.output, "PASSED"));
  CHECK(contains(chosen.output, "TOTAL: 6 test cases run"));
  // perf-p4 on a machine of 2 GPUs (there it is perf-p2), and a typo.
  const ShellRun wrong = dry_run("GPU_RUN_FAKE_GPUS=2 GPU_RUN_PHASES='check perf-p4 fusion-tset'");
  CHECK(wrong.status == 3);
  CHECK(contains(wrong.output, "  perf-p4: no such phase on 2 GPU(s)"));
  CHECK(contains(wrong.output, "  fusion-tset: no such phase on 2 GPU(s)"));
  const ShellRun bad_set = dry_run("GPU_RUN_SET=everything");
  CHECK(bad_set.status == 2);
  CHECK(contains(bad_set.output, "GPU_RUN_SET=everything is not a set"));
}

TEST_CASE("a machine with fewer GPUs than a phase needs leaves it out, and says so") {
  const ShellRun run = dry_run("GPU_RUN_FAKE_GPUS=1");
  CHECK(run.status == 3);
  CHECK(contains(run.output, "  collectives-grouped: needs 2 GPUs, this machine has 1"));
  CHECK(contains(run.output, "  watchdog-drills-4gpu: needs 2 GPUs, this machine has 1"));
  CHECK(contains(line_of(run.output, "communicator-1gpu  "), "the same as communicator-4gpu on 1 GPU(s)"));
}

TEST_CASE("a failed phase, a phase past its own limit, or a test phase with no test case fails the run") {
  const ShellRun failed = dry_run("GPU_RUN_FAKE='collectives-4gpu=1'");
  CHECK(failed.status == 1);
  CHECK(contains(failed.output, "FAILED: 1 phase(s): collectives-4gpu"));
  // check's limit is 120 s, far inside the budget: a hang, not a cut.
  const ShellRun hung = dry_run("GPU_RUN_FAKE='check=0@500'");
  CHECK(hung.status == 1);
  CHECK(contains(line_of(hung.output, "check  "), "TIMED OUT after 120 s"));
  const ShellRun empty = dry_run("GPU_RUN_FAKE='fusion-test=0@1@0'");
  CHECK(empty.status == 1);
  CHECK(contains(line_of(empty.output, "fusion-test  "), "FAILED: no test case"));
  // Failed and incomplete at once: the failure decides the status, both are listed.
  const ShellRun both = dry_run("GPU_RUN_FAKE='check=1 large-1gib=77'");
  CHECK(both.status == 1);
  CHECK(contains(both.output, "FAILED: 1 phase(s): check"));
  CHECK(contains(both.output, "  large-1gib: skipped (exit 77"));
}
