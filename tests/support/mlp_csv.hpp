#pragma once
// The GPU trainer benchmark's CSV files (train_mlp's and bench/ddp_mlp_bench.py's columns), for
// the tests of the scripts that read them: scripts/mlp_table.py and scripts/mlp_plot.py.
#include <filesystem>        // std::filesystem::path
#include <fstream>           // std::ofstream
#include <initializer_list>  // std::initializer_list
#include <string>            // std::string
#include <utility>           // std::pair

#include "support/run_shell.hpp"
#include "support/temp_dir.hpp"

namespace ncclkit_test {

inline const std::string kMlpCsvHeader =
    "impl,gpus,batch,codec,step_ms,samples_per_s,reduce_ms,step_mean_ms,depth,width,accumulation,optimizer,bucket\n";

/// Writes `files` ({name, rows after the header}) into `dir`, then runs scripts/`script` of this
/// checkout with python3 in `dir`, given `arguments` (paths relative to `dir`).
inline ShellRun run_mlp_script(const std::string& script, const TempDir& dir,
                               std::initializer_list<std::pair<std::string, std::string>> files,
                               const std::string& arguments) {
  const std::string path =
      (std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "scripts" / script).lexically_normal().string();
  for (const auto& [name, rows] : files) std::ofstream(dir.path + "/" + name) << kMlpCsvHeader << rows;
  return run_shell("cd '" + dir.path + "' && python3 '" + path + "' " + arguments);
}

}  // namespace ncclkit_test
