// ncclkit-run on one node, as a real program: worker environment, output, failures, restarts,
// signals, and that nothing outlives the launcher (launch/supervisor.hpp, launch/launcher.hpp).
#include <doctest/doctest.h>

#include <cerrno>
#include <regex>
#include <set>

#include "launch/launch_test_support.hpp"
#include "launch/supervisor.hpp"

using namespace launch_test;

namespace {

/// Every worker pid recorded in `dir` is dead.
void check_all_dead(const std::string& dir, const Process& launcher) {
  const auto pids = read_pids(dir);
  CHECK_FALSE(pids.empty());
  for (const auto& [name, pid] : pids) {
    CHECK_MESSAGE(!alive(pid), name, " (pid ", pid, ") outlived the launcher\n", launcher.output());
  }
}

/// Starts a launcher whose workers record their pids and hang, with `failing_steps` for the
/// rank that fails once all pids are recorded; returns the launcher after it ended, and checks
/// that it ended within 5 s of the moment every worker was up.
Process run_with_failure(int nproc, const std::vector<std::string>& failing_steps, const TempDir& dir,
                         const std::vector<std::string>& extra_args = {},
                         const std::vector<std::string>& first_steps = {}) {
  std::vector<std::string> steps = first_steps;
  steps.push_back("pidfile=" + dir.path());
  steps.push_back("waitpids=" + dir.path());
  steps.insert(steps.end(), failing_steps.begin(), failing_steps.end());
  steps.push_back("hang");
  std::vector<std::string> args{"--nproc-per-node", std::to_string(nproc), "--grace-period", "2"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  Process launcher = start_launcher(args, steps, dir.path());
  REQUIRE_MESSAGE(wait_until([&] { return read_pids(dir.path()).size() == static_cast<std::size_t>(nproc); }, 30s),
                  launcher.output());
  const auto all_up = Clock::now();
  REQUIRE_MESSAGE(launcher.wait(30s), launcher.output());
  const auto stopped_after = Clock::now() - all_up;
  CHECK_MESSAGE(stopped_after < 5s, "the group took ",
                std::chrono::duration_cast<std::chrono::milliseconds>(stopped_after).count(), " ms to stop");
  check_all_dead(dir.path(), launcher);
  return launcher;
}

}  // namespace

TEST_CASE("N = 1, 2 and 8 workers get their place in the job, and other variables pass through") {
  for (int n : {1, 2, 8}) {
    CAPTURE(n);
    TempDir dir;
    Process launcher =
        run_launcher({"--nproc-per-node", std::to_string(n)}, {"env", "rendezvous", "print=3"}, dir.path(),
                     {"NCCL_DEBUG=INFO", "CUDA_VISIBLE_DEVICES=3,1", "RANK=77", "NCCLKIT_INIT_URL=file:///nowhere",
                      "LAUNCH_TEST_MARKER=kept as it is"});
    REQUIRE_MESSAGE(launcher.status == 0, launcher.output());
    const std::string out = launcher.out();
    std::set<std::string> run_ids;  // the job's identity for FileStores: one per job
    for (int r = 0; r < n; ++r) {
      const std::string prefix = "[rank " + std::to_string(r) + "] ";
      auto env_lines = lines_starting_with(out, prefix + "env ");
      REQUIRE_MESSAGE(env_lines.size() == 1, out);
      const std::string& env = env_lines[0];
      CHECK(contains(env, " RANK=" + std::to_string(r) + " "));
      CHECK(contains(env, " LOCAL_RANK=" + std::to_string(r) + " "));
      CHECK(contains(env, " WORLD_SIZE=" + std::to_string(n) + " "));
      CHECK(contains(env, " LOCAL_WORLD_SIZE=" + std::to_string(n) + " "));
      CHECK(contains(env, " GROUP_RANK=0 NODE_RANK=0 GROUP_WORLD_SIZE=1 "));
      CHECK(contains(env, " MASTER_ADDR=127.0.0.1 "));
      CHECK(std::regex_search(env, std::regex(" NCCLKIT_INIT_URL=tcp://127\\.0\\.0\\.1:[1-9][0-9]* ")));
      CHECK(contains(env, " NCCLKIT_RESTART_COUNT=0 NCCLKIT_MAX_RESTARTS=0 "));
      CHECK(contains(env, " CUDA_VISIBLE_DEVICES=3,1 NCCL_DEBUG=INFO LAUNCH_TEST_MARKER=kept as it is"));
      std::smatch id;
      CHECK_MESSAGE(std::regex_search(env, id, std::regex(" NCCLKIT_LAUNCH_RUN_ID=([0-9a-f]{32})$")), env);
      if (!id.empty()) run_ids.insert(id[1]);
      CHECK(lines_starting_with(out, prefix + "rank " + std::to_string(r) + " rendezvous ok " + std::to_string(n))
                .size() == 1);
      CHECK(lines_starting_with(out, prefix + "rank " + std::to_string(r) + " line ").size() == 3);
    }
    CHECK(run_ids.size() == 1);
  }
}

TEST_CASE("a worker that exits 3 stops the others; the launcher exits 3 and names the rank") {
  TempDir dir;
  Process launcher = run_with_failure(4, {"r2/exit=3"}, dir);
  CHECK_MESSAGE(launcher.status == 3, launcher.output());
  CHECK_MESSAGE(contains(launcher.err(), "rank 2 (local rank 2, pid "), launcher.output());
  CHECK(std::regex_search(launcher.err(),
                          std::regex("\\) exited with code 3 at [0-9.]+ s; stopping the other 3 workers")));
  CHECK(contains(launcher.err(), "job failed: rank 2"));
}

// ---- the failure report: who ended when, and who is to blame ---------------------------------

namespace {

/// The launcher's report line about `rank` ("ncclkit-run:   rank R (local rank ..."), and its
/// position among the report's lines; fails the test when there is not exactly one.
std::pair<std::string, std::size_t> report_line(const Process& launcher, int rank) {
  const auto lines = lines_starting_with(launcher.err(), "ncclkit-run:   rank ");
  std::pair<std::string, std::size_t> found{"", 0};
  int matches = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind("ncclkit-run:   rank " + std::to_string(rank) + " (", 0) == 0) {
      found = {lines[i], i};
      ++matches;
    }
  }
  CHECK_MESSAGE(matches == 1, "report lines about rank ", rank, ": ", matches, "\n", launcher.output());
  return found;
}

/// The time in "... at 1.250 s", the first one in `line`.
double time_in(const std::string& line) {
  std::smatch match;
  REQUIRE_MESSAGE(std::regex_search(line, match, std::regex(" at ([0-9]+(\\.[0-9]+)?) s")), line);
  return std::stod(match[1]);
}

}  // namespace

TEST_CASE("a rank that exits 0 well before another fails is named as the likely cause, after the failed rank") {
  TempDir dir;
  // Rank 1 leaves at once with code 0; rank 0 waits for it 1.5 s after the launcher has reaped
  // it (more than kLikelyCauseLead), "times out" and exits 1; rank 2 runs on until it is stopped.
  Process launcher = run_with_failure(3,
                                      {"r1/exit=0", "r0/waitgone=" + (dir / "rank_1.pid"), "r0/sleepms=1500",
                                       "r0/stderr=rank 0: timed out waiting for rank 1", "r0/exit=1"},
                                      dir);
  CHECK_MESSAGE(launcher.status == 1, launcher.output());  // the failed worker's status, as documented
  const std::string err = launcher.err();
  CHECK_MESSAGE(contains(err, "how this node's ranks ended, in order (times since the workers started):"), err);
  const auto [early, early_at] = report_line(launcher, 1);
  const auto [failure, failure_at] = report_line(launcher, 0);
  const auto [stopped, stopped_line_at] = report_line(launcher, 2);
  CHECK_MESSAGE(early_at < failure_at, err);  // the early exit is named first
  CHECK(contains(early, ") exited with code 0 at "));
  CHECK(contains(early, "while 2 other ranks still ran: an early exit, the first event"));
  CHECK(contains(failure, ") exited with code 1 at "));
  CHECK(contains(failure, ": the first failure, "));
  CHECK(contains(failure, " after rank 1 exited early"));
  CHECK(time_in(failure) - time_in(early) >= 1.0);
  CHECK(contains(stopped, "; it was still running when the group was stopped at "));
  CHECK(contains(err, "likely cause: rank 1 exited (code 0) at "));
  // The verdict names the failed rank (its status is the job's), then rank 1's earlier exit as
  // the likely cause; rank 0 is not presented as the cause.
  CHECK_MESSAGE(contains(err, "job failed: rank 0 (local rank 0, pid "), err);
  CHECK(contains(err, ") exited with code 1 at "));
  CHECK(contains(err, "; before it, rank 1 had exited with code 0 (at "));
  CHECK(contains(err, "; the likely cause is rank 1's early exit; exit status 1"));
  CHECK_FALSE(contains(err, "likely cause: rank 0"));
}

TEST_CASE("ranks that finish together before the last one fails in its teardown are not blamed for it") {
  TempDir dir;
  // Ranks 0-2 finish together with code 0; 100 ms after the launcher has reaped the last of
  // them, rank 3 dies of SIGSEGV, as a rank that crashes while tearing down does.
  Process launcher = run_with_failure(
      4,
      {"r0/exit=0", "r1/exit=0", "r2/exit=0", "r3/waitgone=" + (dir / "rank_0.pid"),
       "r3/waitgone=" + (dir / "rank_1.pid"), "r3/waitgone=" + (dir / "rank_2.pid"), "r3/sleepms=100", "r3/kill=11"},
      dir);
  CHECK_MESSAGE(launcher.status == 128 + SIGSEGV, launcher.output());
  const std::string err = launcher.err();
  const auto [failure, failure_at] = report_line(launcher, 3);
  for (int r = 0; r < 3; ++r) {
    const auto [finished, finished_at] = report_line(launcher, r);
    CHECK(finished_at < failure_at);
    CHECK_MESSAGE(contains(finished, ") exited with code 0 at "), finished);
    CHECK_MESSAGE(contains(finished, " before the first failure"), finished);
    CHECK_FALSE(contains(finished, "early exit"));
  }
  CHECK(contains(failure, "was killed by signal 11 (SIGSEGV"));
  CHECK_MESSAGE(contains(failure, ": the first failure, after every other rank had finished with code 0"), failure);
  // The verdict names rank 3 first, then the ranks that had finished before it.
  CHECK_MESSAGE(contains(err, "job failed: rank 3 (local rank 3, pid "), err);
  CHECK_MESSAGE(
      std::regex_search(err, std::regex("job failed: rank 3 \\(local rank 3, pid [0-9]+\\) was killed by signal "
                                        "11 \\(SIGSEGV[^)]*\\) at [0-9.]+ s; before it, ranks 0-2 had exited "
                                        "with code 0 \\(at [0-9.]+(-[0-9.]+)? s, [0-9.]+(-[0-9.]+)? s before it\\); "
                                        "exit status 139")),
      err);
  CHECK_FALSE(contains(err, "likely cause"));
}

TEST_CASE("a rank that hangs while another fails is listed as still running, with how long it was silent") {
  TempDir dir;
  // Rank 1 prints one line, then hangs; rank 0 exits 2 once every worker is up (so after that
  // line was written).
  Process launcher = run_with_failure(2, {"r1/hang", "r0/exit=2"}, dir, {}, {"r1/stderr=rank 1 is about to hang"});
  CHECK_MESSAGE(launcher.status == 2, launcher.output());
  const std::string err = launcher.err();
  const auto [failure, failure_at] = report_line(launcher, 0);
  const auto [hung, hung_at] = report_line(launcher, 1);
  CHECK(failure_at < hung_at);
  CHECK(contains(failure, ") exited with code 2 at "));
  CHECK(contains(failure, ": the first failure"));
  CHECK_MESSAGE(contains(hung, "was killed by signal 15 (SIGTERM"), hung);
  CHECK(contains(hung, "; it was still running when the group was stopped at "));
  CHECK_MESSAGE(std::regex_search(hung, std::regex("\\(last output at [0-9.]+ s, silent for [0-9.]+ s by then\\)")),
                hung);
  CHECK(contains(err, "job failed: rank 0 (local rank 0, pid "));
  CHECK_FALSE(contains(err, "likely cause"));  // nothing the launcher can see explains it better
}

TEST_CASE("two ranks that die are reported in the order they died, each with its time") {
  TempDir dir;
  // Rank 2 exits 3 first; rank 1 ignores the SIGTERM that follows and exits 4 once rank 2 is
  // gone; rank 0 writes nothing and is stopped.
  Process launcher = run_with_failure(3, {"r2/exit=3", "r1/waitgone=" + (dir / "rank_2.pid"), "r1/exit=4"}, dir, {},
                                      {"r1/ignoreterm"});
  CHECK_MESSAGE(launcher.status == 3, launcher.output());
  const auto [first, first_at] = report_line(launcher, 2);
  const auto [second, second_at] = report_line(launcher, 1);
  const auto [silent, silent_at] = report_line(launcher, 0);
  CHECK_MESSAGE(first_at < second_at, launcher.err());
  CHECK(contains(first, ") exited with code 3 at "));
  CHECK(contains(first, ": the first failure"));
  CHECK(contains(second, ") exited with code 4 at "));
  CHECK(time_in(first) <= time_in(second));
  CHECK(contains(silent, "(it wrote no output at all)"));
  CHECK(contains(launcher.err(), "job failed: rank 2 (local rank 2, pid "));
}

TEST_CASE("a job stopped by hand after a rank exited 0 early names that exit as the likely cause of the hang") {
  TempDir dir;
  // Rank 1 leaves with code 0; rank 0 waits forever for it. The user then stops the launcher.
  Process launcher = start_launcher(
      {"--nproc-per-node", "2"}, {"pidfile=" + dir.path(), "waitpids=" + dir.path(), "r1/exit=0", "hang"}, dir.path());
  REQUIRE_MESSAGE(wait_until([&] { return read_pids(dir.path()).size() == 2; }, 30s), launcher.output());
  const pid_t rank1 = read_pids(dir.path()).at("rank_1.pid");
  REQUIRE(wait_until([&] { return ::kill(rank1, 0) != 0 && errno == ESRCH; }, 30s));  // reaped by the launcher
  ::kill(launcher.pid, SIGTERM);
  REQUIRE(launcher.wait(30s));
  CHECK_MESSAGE(launcher.status == 128 + SIGTERM, launcher.output());
  const auto [early, early_at] = report_line(launcher, 1);
  const auto [hung, hung_at] = report_line(launcher, 0);
  CHECK(early_at < hung_at);
  CHECK(contains(early, ") exited with code 0 at "));
  CHECK(contains(early, "while 1 other rank still ran: an early exit, the first event"));
  CHECK(contains(hung, "; it was still running when the group was stopped at "));
  CHECK(contains(launcher.err(), "likely cause: rank 1 exited (code 0) at "));
  CHECK(contains(launcher.err(), "if the others were waiting for it, that is why they had not finished"));
}

TEST_CASE("a worker that calls abort() gives 128 + SIGABRT") {
  TempDir dir;
  Process launcher = run_with_failure(3, {"r0/abort"}, dir);
  CHECK_MESSAGE(launcher.status == 128 + SIGABRT, launcher.output());
  CHECK(contains(launcher.err(), "rank 0 (local rank 0, pid "));
  CHECK(contains(launcher.err(), "was killed by signal 6 (SIGABRT"));
}

TEST_CASE("a worker killed by SIGKILL gives 137, and workers that ignore SIGTERM are killed after the grace period") {
  TempDir dir;
  Process launcher = run_with_failure(3, {"r1/kill=9"}, dir, {"--grace-period", "0.5"}, {"ignoreterm"});
  CHECK_MESSAGE(launcher.status == 128 + SIGKILL, launcher.output());
  CHECK(contains(launcher.err(), "was killed by signal 9 (SIGKILL"));
  CHECK(contains(launcher.err(), "still running after the grace period; sending SIGKILL"));
}

TEST_CASE("--max-restarts restarts the whole group until it succeeds, with NCCLKIT_RESTART_COUNT") {
  TempDir dir;
  // Rank 1 fails in attempts 0 and 1 (differently); attempt 2 succeeds.
  Process launcher = run_launcher({"--nproc-per-node", "2", "--max-restarts", "3", "--log-dir", dir / "logs"},
                                  {"env", "r1a0/exit=3", "r1a1/abort", "rendezvous"}, dir.path());
  REQUIRE_MESSAGE(launcher.status == 0, launcher.output());
  const std::string out = launcher.out();
  // Rank 1 prints in every attempt; rank 0 may be stopped before it prints in the failed ones.
  for (int attempt = 0; attempt < 3; ++attempt) {
    for (int r = 0; r < 2; ++r) {
      const auto lines = lines_starting_with(out, "[rank " + std::to_string(r) + "] env RANK=" + std::to_string(r));
      int matching = 0;
      for (const auto& line : lines)
        matching += contains(line, "NCCLKIT_RESTART_COUNT=" + std::to_string(attempt) + " NCCLKIT_MAX_RESTARTS=3");
      if (r == 1 || attempt == 2) {
        CHECK_MESSAGE(matching == 1, "rank ", r, " attempt ", attempt, "\n", out);
      } else {
        CHECK(matching <= 1);
      }
    }
  }
  CHECK(contains(launcher.err(), "restarting the worker group (restart 1 of 3) after: rank 1"));
  CHECK(contains(launcher.err(), "restarting the worker group (restart 2 of 3) after: rank 1"));
  CHECK(lines_starting_with(out, "[rank 1] rank 1 rendezvous ok 2").size() == 1);
  // The log file has all three attempts, marked.
  const std::string log = read_file(dir / "logs/rank_1.log");
  CHECK(contains(log, "---- ncclkit-run: restart 1 of 3 ----"));
  CHECK(contains(log, "---- ncclkit-run: restart 2 of 3 ----"));
  CHECK(contains(log, "rank 1 rendezvous ok 2"));
}

TEST_CASE("when the restart budget is spent, the launcher exits with the last failure's status") {
  TempDir dir;
  Process launcher =
      run_launcher({"--nproc-per-node", "2", "--max-restarts", "1"}, {"env", "r0/exit=5", "r1/hang"}, dir.path());
  CHECK_MESSAGE(launcher.status == 5, launcher.output());
  CHECK(lines_starting_with(launcher.out(), "[rank 0] env").size() == 2);  // two attempts, no more
  CHECK(contains(launcher.err(), "job failed: rank 0"));
  CHECK(contains(launcher.err(), "(after 1 restart of 1)"));
}

TEST_CASE("SIGTERM and SIGINT to the launcher are forwarded; SIGUSR1 is forwarded without stopping") {
  for (int sig : {SIGTERM, SIGINT}) {
    CAPTURE(sig);
    TempDir dir;
    Process launcher =
        start_launcher({"--nproc-per-node", "2"}, {"signals", "pidfile=" + dir.path(), "hang"}, dir.path());
    REQUIRE_MESSAGE(wait_until([&] { return read_pids(dir.path()).size() == 2; }, 30s), launcher.output());
    if (sig == SIGTERM) {
      ::kill(launcher.pid, SIGUSR1);
      REQUIRE_MESSAGE(wait_until([&] { return lines_starting_with(launcher.out(), "[rank ").size() == 2; }, 10s),
                      launcher.output());
      CHECK(contains(launcher.out(), "[rank 0] rank 0 got SIGUSR1\n"));
      CHECK(contains(launcher.out(), "[rank 1] rank 1 got SIGUSR1\n"));
    }
    ::kill(launcher.pid, sig);
    REQUIRE(launcher.wait(10s));
    CHECK_MESSAGE(launcher.status == 128 + sig, launcher.output());
    const std::string name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    CHECK(contains(launcher.out(), "[rank 0] rank 0 got " + name + "\n"));
    CHECK(contains(launcher.out(), "[rank 1] rank 1 got " + name + "\n"));
    CHECK(contains(launcher.err(), "got " + name + "; forwarding it to 2 workers"));
    check_all_dead(dir.path(), launcher);
  }
}

TEST_CASE("a second signal skips the grace period") {
  TempDir dir;
  Process launcher = start_launcher({"--nproc-per-node", "2", "--grace-period", "60"},
                                    {"ignoreterm", "pidfile=" + dir.path(), "hang"}, dir.path());
  REQUIRE(wait_until([&] { return read_pids(dir.path()).size() == 2; }, 30s));
  ::kill(launcher.pid, SIGTERM);
  REQUIRE(wait_until([&] { return contains(launcher.err(), "forwarding it"); }, 10s));
  ::kill(launcher.pid, SIGTERM);
  REQUIRE_MESSAGE(launcher.wait(10s), launcher.output());
  CHECK(launcher.status == 128 + SIGTERM);
  check_all_dead(dir.path(), launcher);
}

TEST_CASE("workers die with the launcher when it is SIGKILLed") {
  TempDir dir;
  Process launcher =
      start_launcher({"--nproc-per-node", "3"}, {"ignoreterm", "pidfile=" + dir.path(), "hang"}, dir.path());
  REQUIRE(wait_until([&] { return read_pids(dir.path()).size() == 3; }, 30s));
  ::kill(launcher.pid, SIGKILL);
  REQUIRE(launcher.wait(10s));
  for (const auto& [name, pid] : read_pids(dir.path())) {
    CHECK_MESSAGE(wait_until([&] { return !alive(pid); }, 5s), name, " (pid ", pid, ") survived its launcher");
  }
}

TEST_CASE("processes the workers leave behind are stopped, in their process group or not") {
  for (bool fail : {false, true}) {
    CAPTURE(fail);
    TempDir dir;
    // Every worker has its two children before rank 1 fails.
    std::vector<std::string> steps{"grandchild=" + dir.path(), "daemon=" + dir.path(), "pidfile=" + dir.path(),
                                   "waitpids=" + dir.path()};
    if (fail) steps.push_back("r1/exit=4");
    Process launcher = run_launcher({"--nproc-per-node", "2", "--grace-period", "1"}, steps, dir.path());
    CHECK_MESSAGE(launcher.status == (fail ? 4 : 0), launcher.output());
    CHECK(read_pids(dir.path()).size() == 6);
    check_all_dead(dir.path(), launcher);
  }
}

TEST_CASE("a worker that ended is reaped at once, while the others still run") {
  TempDir dir;
  Process launcher =
      start_launcher({"--nproc-per-node", "2"}, {"pidfile=" + dir.path(), "r1/waitfile=" + (dir / "go")}, dir.path());
  REQUIRE(wait_until([&] { return read_pids(dir.path()).size() == 2; }, 30s));
  const pid_t rank0 = read_pids(dir.path()).at("rank_0.pid");
  // Rank 0 exits at once; it must not stay a zombie of the launcher.
  CHECK(wait_until([&] { return ::kill(rank0, 0) != 0; }, 10s));
  std::ofstream(dir / "go") << "1";
  REQUIRE(launcher.wait(30s));
  CHECK_MESSAGE(launcher.status == 0, launcher.output());
}

TEST_CASE("output: whole lines with the rank prefix, a partial last line, and --log-dir") {
  TempDir dir;
  Process launcher = run_launcher({"--nproc-per-node", "4", "--log-dir", dir / "logs"},
                                  {"print=2000", "stderr=to stderr", "partial=no newline at the end"}, dir.path());
  REQUIRE_MESSAGE(launcher.status == 0, launcher.output());
  const std::string out = launcher.out();
  std::istringstream lines(out);
  std::string line;
  std::map<int, int> next_line;
  const std::regex whole("\\[rank ([0-3])\\] rank \\1 line ([0-9]+)");
  int partial = 0;
  while (std::getline(lines, line)) {
    std::smatch match;
    if (std::regex_match(line, match, whole)) {
      const int rank = std::stoi(match[1]);
      CHECK(std::stoi(match[2]) == next_line[rank]);  // in order, none lost, none split
      ++next_line[rank];
    } else {
      CHECK_MESSAGE(std::regex_match(line, std::regex("\\[rank [0-3]\\] no newline at the end")), line);
      ++partial;
    }
  }
  CHECK(partial == 4);
  for (int r = 0; r < 4; ++r) CHECK(next_line[r] == 2000);
  CHECK(out.back() == '\n');
  CHECK(lines_starting_with(launcher.err(), "[rank 2] to stderr").size() == 1);
  const std::string log = read_file(dir / "logs/rank_2.log");
  CHECK(lines_starting_with(log, "rank 2 line ").size() == 2000);
  CHECK(contains(log, "to stderr\n"));
  CHECK(contains(log, "\nno newline at the end\n"));
  CHECK_FALSE(contains(log, "[rank"));
}

TEST_CASE("a program that cannot be found gives 127 and says so") {
  TempDir dir;
  Process launcher = start({kLauncher, "--nproc-per-node", "2", "--", dir / "no-such-program"}, dir.path(), "launcher");
  REQUIRE(launcher.wait(30s));
  CHECK(launcher.status == 127);
  CHECK_MESSAGE(contains(launcher.err(), "cannot execute '" + (dir / "no-such-program") + "' for rank 0"),
                launcher.output());
}

TEST_CASE("usage errors give exit status 2") {
  TempDir dir;
  Process launcher = start({kLauncher, "--nproc-per-node", "0", "--", "true"}, dir.path(), "launcher");
  REQUIRE(launcher.wait(30s));
  CHECK(launcher.status == 2);
  CHECK(contains(launcher.err(), "--nproc-per-node '0' must be a whole number in [1, 4096]"));
}

TEST_CASE("a worker group that cannot start leaves no descriptor open (its log files included)") {
  TempDir dir;
  ncclkit::launch::SignalCatcher signals;
  auto open_descriptors = [] {
    std::size_t count = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++count;
    return count;
  };
  const std::size_t before = open_descriptors();
  // Rank 0's log file is open when rank 1 turns out to have no program: nothing has started.
  const std::vector<ncclkit::launch::WorkerSpec> specs{{0, 0, {"true"}, {}}, {1, 1, {}, {}}};
  const ncclkit::launch::SuperviseOptions options{.log_dir = dir / "logs"};
  CHECK_THROWS_WITH_AS(ncclkit::launch::run_worker_group(specs, signals, options),
                       "ncclkit-run: worker 1 has no program", ncclkit::ConfigError);
  CHECK(open_descriptors() == before);
}
