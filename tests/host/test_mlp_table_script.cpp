// scripts/mlp_table.py, the GPU trainer benchmark's table, on CSV rows written here in the
// columns of train_mlp and bench/ddp_mlp_bench.py: each row's scaling efficiency (1-GPU step / this
// step) and share of communication hidden (1 - (step - 1-GPU step) / reduction alone) against its
// own side's 1-GPU row, and a non-zero exit status naming what is missing (a file, a column, a
// row's 1-GPU row or reduction alone, one side's rows) instead of a table with silent gaps.
#include <doctest/doctest.h>

#include <fstream>           // std::ofstream
#include <initializer_list>  // std::initializer_list
#include <string>            // std::string
#include <utility>           // std::pair

#include "support/mlp_csv.hpp"
#include "support/run_shell.hpp"
#include "support/temp_dir.hpp"
#include "support/text.hpp"

namespace mlp_table_test {

using ncclkit_test::contains;
using ncclkit_test::ShellRun;

/// scripts/mlp_table.py run in `dir` on `files` ({name, rows after the header}) with `names`.
ShellRun run_table(const ncclkit_test::TempDir& dir, std::initializer_list<std::pair<std::string, std::string>> files,
                   const std::string& names) {
  return ncclkit_test::run_mlp_script("mlp_table.py", dir, files, names);
}

// One GPU: ncclkit 2.0 ms, PyTorch 2.5 ms. Two GPUs: ncclkit 2.5 ms with float32 gradients whose
// reduction alone takes 1.6 ms, 2.2 ms with fp16 (0.8 ms); DDP 5.0 ms (1.5 ms), its fp16 hook
// 7.5 ms (1.0 ms). Batch 64 per GPU.
const std::string kNcclkit1 = "ncclkit,1,64,none,2.0000,32000.0,0.0100,2.1,8,4096,1,sgd,25 MiB\n";
const std::string kNcclkit2 =
    "ncclkit,2,64,none,2.5000,51200.0,1.6000,2.6,8,4096,1,sgd,25 MiB\n"
    "ncclkit,2,64,fp16,2.2000,58181.8,0.8000,2.3,8,4096,1,sgd,25 MiB\n";
const std::string kTorch1 = "torch-1gpu,1,64,none,2.5000,25600.0,,2.6,8,4096,1,sgd,-\n";
const std::string kTorch2 =
    "ddp,2,64,none,5.0000,25600.0,1.5000,5.1,8,4096,1,sgd,25 MiB (DDP)\n"
    "ddp-fp16hook,2,64,fp16,7.5000,17066.7,1.0000,7.6,8,4096,1,sgd,25 MiB (DDP)\n";

}  // namespace mlp_table_test

TEST_CASE("mlp_table.py measures each side against its own 1-GPU step: efficiency, share hidden, samples/s") {
  using namespace mlp_table_test;
  ncclkit_test::TempDir dir("mlp-table");
  const ShellRun run =
      run_table(dir, {{"n1.csv", kNcclkit1}, {"n2.csv", kNcclkit2}, {"t1.csv", kTorch1}, {"t2.csv", kTorch2}},
                "n1.csv n2.csv t1.csv t2.csv");
  INFO(run.output);
  CHECK(run.status == 0);
  // ncclkit float32: 2.0 / 2.5 = 0.80; hidden 1 - 0.5 / 1.6 = 0.69; 51200 / 25600 = 2.00x.
  CHECK(contains(run.output, "| ncclkit | 2 | 64 | none | 2.500 | 2.000 | 0.80 | 51,200 | 1.600 | 0.69 | 2.00x |"));
  // fp16: 2.0 / 2.2 = 0.91; 1 - 0.2 / 0.8 = 0.75.
  CHECK(contains(run.output, "| ncclkit | 2 | 64 | fp16 | 2.200 | 2.000 | 0.91 | 58,182 | 0.800 | 0.75 | 2.27x |"));
  // DDP against PyTorch's one GPU: 2.5 / 5.0 = 0.50; 1 - 2.5 / 1.5 = -0.67 (overlap costs more).
  CHECK(contains(run.output, "| ddp | 2 | 64 | none | 5.000 | 2.500 | 0.50 | 25,600 | 1.500 | -0.67 | 1.00x |"));
  CHECK(contains(run.output, "| ddp-fp16hook | 2 | 64 | fp16 | 7.500 | 2.500 | 0.33 |"));
  // One GPU: no reduction, nothing hidden.
  CHECK(contains(run.output, "| ncclkit | 1 | 64 | none | 2.000 | 2.000 | 1.00 | 32,000 | - | - | 1.25x |"));
}

TEST_CASE("mlp_table.py measures an ablation's row (train_mlp --label) against its own 1-GPU row, else ncclkit's") {
  using namespace mlp_table_test;
  ncclkit_test::TempDir dir("mlp-table");
  // "whole" has no 1-GPU row: against ncclkit's 2.0 ms, 2.0 / 2.8 = 0.71. "sms" has its own
  // 1-GPU row of 2.2 ms: 2.2 / 2.75 = 0.80, where ncclkit's row would give 0.73.
  const std::string ablation =
      "ncclkit/whole,2,64,none,2.8000,45714.3,1.6000,2.9,8,4096,1,sgd,whole buffer\n"
      "ncclkit/sms,1,64,none,2.2000,29090.9,0.0100,2.3,8,4096,1,sgd,25 MiB\n"
      "ncclkit/sms,2,64,none,2.7500,46545.5,1.6000,2.8,8,4096,1,sgd,25 MiB\n";
  const ShellRun run =
      run_table(dir, {{"n1.csv", kNcclkit1}, {"a.csv", ablation}, {"t1.csv", kTorch1}, {"t2.csv", kTorch2}},
                "n1.csv a.csv t1.csv t2.csv");
  INFO(run.output);
  CHECK(run.status == 0);
  CHECK(contains(run.output, "| ncclkit/whole | 2 | 64 | none | 2.800 | 2.000 | 0.71 |"));
  CHECK(contains(run.output, "| ncclkit/sms | 2 | 64 | none | 2.750 | 2.200 | 0.80 |"));
}

TEST_CASE("mlp_table.py fails, naming it, when a file, a column or a row it measures against is missing") {
  using namespace mlp_table_test;
  ncclkit_test::TempDir dir("mlp-table");
  SUBCASE("a file that is not there") {
    const ShellRun run = run_table(dir, {{"n1.csv", kNcclkit1}}, "n1.csv missing.csv");
    CHECK(run.status == 1);
    CHECK(contains(run.output, "mlp_table: cannot read missing.csv"));
  }
  SUBCASE("a CSV of something else") {
    std::ofstream(dir.path + "/other.csv") << "size,count,type\n8,2,float\n";
    const ShellRun run = run_table(dir, {}, "other.csv");
    CHECK(run.status == 1);
    CHECK(contains(run.output, "other.csv: no column impl, gpus, batch"));
  }
  SUBCASE("a step time that is not a number") {
    const ShellRun run = run_table(dir, {{"bad.csv", "ncclkit,2,64,none,fast,1,1,1,8,4096,1,sgd,-\n"}}, "bad.csv");
    CHECK(run.status == 1);
    CHECK(contains(run.output, "bad.csv:2: a field is not a number"));
  }
  SUBCASE("no 1-GPU row: the table is printed with gaps, and the run fails") {
    const ShellRun run =
        run_table(dir, {{"n2.csv", kNcclkit2}, {"t1.csv", kTorch1}, {"t2.csv", kTorch2}}, "n2.csv t1.csv t2.csv");
    CHECK(run.status == 1);
    CHECK(contains(run.output, "| ncclkit | 2 | 64 | none | 2.500 | - | - |"));
    CHECK(contains(run.output, "ncclkit none at 2 GPU(s), batch 64 (n2.csv:2): no ncclkit at 1 GPU row"));
  }
  SUBCASE("no PyTorch rows at 2 GPUs") {
    const ShellRun run =
        run_table(dir, {{"n1.csv", kNcclkit1}, {"n2.csv", kNcclkit2}, {"t1.csv", kTorch1}}, "n1.csv n2.csv t1.csv");
    CHECK(run.status == 1);
    CHECK(contains(run.output, "2 GPU(s), batch 64: no PyTorch row to compare with"));
  }
  SUBCASE("a multi-GPU row without its reduction alone") {
    const ShellRun run = run_table(dir,
                                   {{"n1.csv", kNcclkit1},
                                    {"n2.csv", "ncclkit,2,64,none,2.5000,51200.0,,2.6,8,4096,1,sgd,25 MiB\n"},
                                    {"t1.csv", kTorch1},
                                    {"t2.csv", kTorch2}},
                                   "n1.csv n2.csv t1.csv t2.csv");
    CHECK(run.status == 1);
    CHECK(contains(run.output, "no reduction alone (reduce_ms), so no share hidden"));
  }
  SUBCASE("rows of two models") {
    const ShellRun run = run_table(dir,
                                   {{"n1.csv", "ncclkit,1,64,none,2.0000,32000.0,0.0100,2.1,8,2048,1,sgd,25 MiB\n"},
                                    {"n2.csv", kNcclkit2},
                                    {"t1.csv", kTorch1},
                                    {"t2.csv", kTorch2}},
                                   "n1.csv n2.csv t1.csv t2.csv");
    CHECK(run.status == 1);
    CHECK(contains(run.output, "rows of different models (depth x width: 8 x 2048, 8 x 4096)"));
  }
}
