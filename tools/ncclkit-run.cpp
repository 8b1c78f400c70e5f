// ncclkit-run: starts one worker per GPU (or as many as asked) on this node, for one node or
// many, and supervises them. The logic lives in tools/launch/ (testable headers);
// this file only maps it onto a process: arguments in, exit status out. docs/launch.md.
#include <cstdio>     // std::fputs, std::printf
#include <exception>  // std::exception
#include <string>     // std::string

#include "launch/check.hpp"
#include "launch/launcher.hpp"
#include "launch/options.hpp"
#include "launch/signals.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/version.hpp"

namespace {

/// One line on stderr, with the program's name in front unless the message has it already.
void print_error(const std::string& message) {
  const bool named = message.rfind("ncclkit-run", 0) == 0;
  ncclkit::launch::detail::write_fully(2, (named ? "" : "ncclkit-run: error: ") + message + "\n");
}

}  // namespace

int main(int argc, char** argv) {
  ncclkit::launch::LaunchOptions options;
  try {
    options = ncclkit::launch::parse_launch_args(argc, argv);
  } catch (const std::exception& e) {
    print_error(e.what());
    return 2;
  }
  if (options.help) {
    std::fputs(ncclkit::launch::launch_usage().c_str(), stdout);
    return 0;
  }
  if (options.version) {
    std::printf("ncclkit-run (ncclkit %s)\n", ncclkit::kVersionString);
    return 0;
  }
  try {
    // First of all: from here on, SIGINT/SIGTERM either kill the launcher (no workers yet) or
    // are forwarded to the workers.
    ncclkit::launch::SignalCatcher signals;
    if (options.check) return ncclkit::launch::run_check(options);
    return ncclkit::launch::run_launcher(options, signals);
  } catch (const std::exception& e) {
    print_error(e.what());
    return 1;
  }
}
