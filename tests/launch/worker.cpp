// launch_test_worker: a worker for the launcher's tests that does, step by step, what its
// arguments say, and misbehaves on command.
//
//   launch_test_worker STEP...
//
// A step may be limited to one rank and/or one attempt (NCCLKIT_RESTART_COUNT) by a prefix:
// "r2/abort" (rank 2 only), "a0/exit=3" (first attempt only), "r1a0/exit=3" (both).
//
//   pidfile=DIR     write DIR/rank_<R>.pid (this process's pid), atomically
//   waitpids=DIR    wait until DIR holds WORLD_SIZE rank_*.pid files (30 s, then exit 99)
//   env             print one line with the launcher's variables
//   print=N         print N lines "rank R line I" to stdout
//   stderr=TEXT     print "TEXT" as one line to stderr
//   partial=TEXT    write TEXT to stdout without a newline
//   exit=C          exit with code C
//   abort           call abort()
//   kill=SIG        raise signal number SIG (9 = SIGKILL)
//   hang            wait for signals forever
//   ignoreterm      ignore SIGTERM from now on
//   signals         print "rank R got SIGxxx" on SIGINT/SIGTERM/SIGHUP/SIGUSR1; exit 128+sig
//                   for the first three
//   grandchild=DIR  fork a child (same process group) that writes DIR/grandchild_<R>.pid, hangs
//   daemon=DIR      fork a child that calls setsid() (leaves the group), writes
//                   DIR/daemon_<R>.pid, hangs
//   rendezvous      detect_world(), open the store of NCCLKIT_INIT_URL, barrier over all
//                   ranks, check a sum over all ranks; print "rank R rendezvous ok WORLD URL"
//   sleepms=N       sleep N ms
//   touch=PATH      create PATH.<R>
//   waitfile=PATH   wait until PATH exists (30 s, then exit 98)
//   waitgone=PATH   wait until the process whose pid PATH holds is gone, reaped by the
//                   launcher (30 s, then exit 96)
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ncclkit/bootstrap/environment.hpp"
#include "ncclkit/bootstrap/init_url.hpp"
#include "ncclkit/store/barrier.hpp"

namespace {

int g_rank = 0;

int env_number(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value == nullptr ? fallback : std::atoi(value);
}

std::string env_text(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "<unset>" : value;
}

void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

void write_pid_file(const std::string& path, pid_t pid) {
  const std::string temporary = path + ".tmp";
  std::ofstream(temporary) << pid << "\n";
  std::filesystem::rename(temporary, path);
}

std::string read_text(const std::string& path) {
  std::ifstream file(path);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

bool wait_until(const std::function<bool()>& done, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

[[noreturn]] void hang_forever() {
  for (;;) ::pause();
}

void on_signal(int sig) {
  char line[64];
  const char* name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "SIGUSR1";
  const int n = std::snprintf(line, sizeof line, "rank %d got %s\n", g_rank, name);
  [[maybe_unused]] ssize_t ignored = ::write(1, line, static_cast<std::size_t>(n));
  if (sig != SIGUSR1) ::_exit(128 + sig);
}

void fork_hanging_child(const std::string& path, bool new_session) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (new_session) ::setsid();
    write_pid_file(path, ::getpid());
    hang_forever();
  }
  // The parent waits until the pid is on disk, so the test can always find the child.
  wait_until([&] { return std::filesystem::exists(path); }, std::chrono::seconds(30));
}

void rendezvous() {
  const ncclkit::WorldInfo world = ncclkit::detect_world();
  std::shared_ptr<ncclkit::Store> store = ncclkit::make_store(world.init_url, world);
  ncclkit::barrier(*store, world.rank, world.world_size, "start");
  store->add("sum", world.rank + 1);
  ncclkit::barrier(*store, world.rank, world.world_size, "added");
  const long long sum = store->add("sum", 0);
  const long long expected = 1LL * world.world_size * (world.world_size + 1) / 2;
  if (sum != expected) {
    write_all(2, "rank " + std::to_string(world.rank) + " sum " + std::to_string(sum) +
                     " != " + std::to_string(expected) + "\n");
    std::exit(97);
  }
  // Rank 0 serves a TCP store: it leaves last, once every other rank is done with the store.
  if (world.rank != 0) {
    store->set("left/" + std::to_string(world.rank), "1");
  } else {
    std::vector<std::string> keys;
    for (int r = 1; r < world.world_size; ++r) keys.push_back("left/" + std::to_string(r));
    store->wait(keys, std::chrono::seconds(60));
  }
  write_all(1, "rank " + std::to_string(world.rank) + " rendezvous ok " + std::to_string(world.world_size) + " " +
                   world.init_url + "\n");
}

}  // namespace

int main(int argc, char** argv) {
  g_rank = env_number("RANK", -1);
  const int world = env_number("WORLD_SIZE", 1);
  const int attempt = env_number("NCCLKIT_RESTART_COUNT", 0);
  for (int i = 1; i < argc; ++i) {
    std::string step = argv[i];
    if (auto slash = step.find('/'); slash != std::string::npos && slash < step.find('=')) {
      const std::string condition = step.substr(0, slash);
      step = step.substr(slash + 1);
      bool applies = true;
      for (std::size_t k = 0; k < condition.size();) {
        const char what = condition[k++];
        std::size_t end = k;
        while (end < condition.size() && condition[end] >= '0' && condition[end] <= '9') ++end;
        const int value = std::atoi(condition.substr(k, end - k).c_str());
        k = end;
        if (what == 'r' && value != g_rank) applies = false;
        if (what == 'a' && value != attempt) applies = false;
      }
      if (!applies) continue;
    }
    const auto eq = step.find('=');
    const std::string name = step.substr(0, eq);
    const std::string arg = eq == std::string::npos ? "" : step.substr(eq + 1);
    if (name == "pidfile") {
      write_pid_file(arg + "/rank_" + std::to_string(g_rank) + ".pid", ::getpid());
    } else if (name == "waitpids") {
      auto all_there = [&] {
        for (int r = 0; r < world; ++r)
          if (!std::filesystem::exists(arg + "/rank_" + std::to_string(r) + ".pid")) return false;
        return true;
      };
      if (!wait_until(all_there, std::chrono::seconds(30))) return 99;
    } else if (name == "env") {
      std::string line = "env";
      for (const char* variable :
           {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "GROUP_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT", "NCCLKIT_INIT_URL", "NCCLKIT_RESTART_COUNT", "NCCLKIT_MAX_RESTARTS",
            "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "LAUNCH_TEST_MARKER", "NCCLKIT_LAUNCH_RUN_ID"}) {
        line += std::string(" ") + variable + "=" + env_text(variable);
      }
      write_all(1, line + "\n");
    } else if (name == "print") {
      const int lines = std::atoi(arg.c_str());
      for (int k = 0; k < lines; ++k) {
        write_all(1, "rank " + std::to_string(g_rank) + " line " + std::to_string(k) + "\n");
      }
    } else if (name == "stderr") {
      write_all(2, arg + "\n");
    } else if (name == "partial") {
      write_all(1, arg);
    } else if (name == "exit") {
      return std::atoi(arg.c_str());
    } else if (name == "abort") {
      std::abort();
    } else if (name == "kill") {
      ::raise(std::atoi(arg.c_str()));
    } else if (name == "hang") {
      hang_forever();
    } else if (name == "ignoreterm") {
      ::signal(SIGTERM, SIG_IGN);
    } else if (name == "signals") {
      for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) ::signal(sig, on_signal);
    } else if (name == "grandchild") {
      fork_hanging_child(arg + "/grandchild_" + std::to_string(g_rank) + ".pid", false);
    } else if (name == "daemon") {
      fork_hanging_child(arg + "/daemon_" + std::to_string(g_rank) + ".pid", true);
    } else if (name == "rendezvous") {
      try {
        rendezvous();
      } catch (const std::exception& e) {
        write_all(2, std::string("rendezvous failed: ") + e.what() + "\n");
        return 1;
      }
    } else if (name == "sleepms") {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(arg.c_str())));
    } else if (name == "touch") {
      std::ofstream(arg + "." + std::to_string(g_rank)) << "1\n";
    } else if (name == "waitfile") {
      if (!wait_until([&] { return std::filesystem::exists(arg); }, std::chrono::seconds(30))) return 98;
    } else if (name == "waitgone") {
      const pid_t pid = std::atoi(read_text(arg).c_str());
      if (pid <= 0) return 96;
      // kill(pid, 0) succeeds on a zombie: ESRCH means the launcher has reaped it.
      if (!wait_until([&] { return ::kill(pid, 0) != 0 && errno == ESRCH; }, std::chrono::seconds(30))) return 96;
    } else {
      write_all(2, "launch_test_worker: unknown step '" + step + "'\n");
      return 90;
    }
  }
  return 0;
}
