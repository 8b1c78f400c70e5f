// Tests of ncclkit/store/file_store.hpp: the Store semantics, key encoding, permissions,
// timeouts and the run scheme (fresh runs, stale folders, cleanup). Multi-process rendezvous
// tests with 2, 8 and 64 processes are in test_file_store_processes.cpp.
#include <doctest/doctest.h>

#include <signal.h>    // raise, SIGKILL
#include <stdlib.h>    // mkdtemp, setenv, unsetenv
#include <sys/stat.h>  // stat, umask

#include <algorithm>   // std::sort
#include <atomic>      // std::atomic
#include <chrono>      // std::chrono
#include <cstdint>     // std::uint64_t
#include <cstring>     // std::memcpy
#include <filesystem>  // std::filesystem
#include <memory>      // std::unique_ptr
#include <optional>    // std::optional
#include <string>      // std::string
#include <thread>      // std::thread
#include <utility>     // std::pair
#include <vector>      // std::vector

#include "support/store_values.hpp"
#include "support/temp_dir.hpp"
#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/store/barrier.hpp"
#include "ncclkit/store/file_store.hpp"
#include "support/checker.hpp"

using namespace std::chrono_literals;
using ncclkit::Bytes;
using ncclkit::FileStore;
using Clock = std::chrono::steady_clock;

namespace {

using ncclkit_test::entries;

using ncclkit_test::random_bytes;
using ncclkit_test::TempDir;

mode_t mode_of(const std::string& path) {
  struct stat info {};
  REQUIRE(::stat(path.c_str(), &info) == 0);
  return info.st_mode & 07777;
}

bool contains_text(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

TEST_CASE("set, get, check, delete_key and num_keys in one process") {
  TempDir dir;
  FileStore store(dir.path, {.world_size = 1});
  CHECK(store.describe() == "file://" + dir.path);
  CHECK(store.member() == 0);
  CHECK(store.run_id().size() == 32);
  CHECK(store.num_keys() == 0);
  CHECK_FALSE(store.check({"a"}));
  store.set("a", "first");
  store.set("b", "bee");
  CHECK(store.check({"a", "b"}));
  CHECK_FALSE(store.check({"a", "c"}));
  CHECK(store.get_string("a") == "first");
  store.set("a", "second");  // replaces
  CHECK(store.get_string("a") == "second");
  CHECK(store.num_keys() == 2);
  CHECK(store.delete_key("a"));
  CHECK_FALSE(store.delete_key("a"));
  CHECK_FALSE(store.check({"a"}));
  CHECK(store.num_keys() == 1);
  store.wait({"b"}, 0ms);  // present: returns at once even with no time to wait
}

TEST_CASE("keys may hold any bytes; escaped and hashed names never collide") {
  TempDir dir;
  FileStore store(dir.path, {.world_size = 1});
  const std::string long_key(1000, 'x');
  std::string long_key_2 = long_key;
  long_key_2.back() = 'y';
  std::vector<std::string> keys = {
      "a/b", "A/b",      "a%2fb", "%41",    "A",        std::string("nul\0byte", 8), "", ".", "..",
      "/",   "\xff\xfe", "k-a",   long_key, long_key_2, std::string(300, '/')};
  for (std::size_t i = 0; i < keys.size(); ++i) store.set(keys[i], "value " + std::to_string(i));
  CHECK(store.num_keys() == static_cast<std::int64_t>(keys.size()));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    CAPTURE(i);
    CHECK(store.get_string(keys[i], 1s) == "value " + std::to_string(i));
  }
  for (const auto& name : entries(dir.path + "/r-" + store.run_id())) CHECK(name.size() <= 220);
  CHECK(store.add(long_key + "counter", 5) == 5);
  CHECK(store.add(long_key + "counter", -2) == 3);
  CHECK(store.delete_key(long_key));
  CHECK_FALSE(store.check({long_key}));
  CHECK(store.check({long_key_2}));
}

TEST_CASE("values of 0 B and 16 MiB (and a bit more) round-trip exactly") {
  TempDir dir;
  FileStore store(dir.path, {.world_size = 1});
  store.set("empty", Bytes{});
  CHECK(store.get("empty", 1s).empty());
  CHECK(store.check({"empty"}));
  for (std::size_t size : {std::size_t{16} << 20, (std::size_t{16} << 20) + 12345}) {
    const Bytes big = random_bytes(size, size);
    store.set("big", big);
    CHECK(store.get("big", 1s) == big);
  }
}

TEST_CASE("compare_set follows the Store contract") {
  TempDir dir;
  FileStore store(dir.path, {.world_size = 1});
  // Missing key, non-empty expected: nothing is set, `expected` comes back.
  CHECK(store.compare_set("k", "old", "new") == "old");
  CHECK_FALSE(store.check({"k"}));
  // Missing key, empty expected: set.
  CHECK(store.compare_set("k", "", "v1") == "v1");
  CHECK(store.get_string("k") == "v1");
  // Mismatch: the current value comes back, nothing changes.
  CHECK(store.compare_set("k", "nope", "v2") == "v1");
  CHECK(store.get_string("k") == "v1");
  // Match: replaced.
  CHECK(store.compare_set("k", "v1", "v2") == "v2");
  CHECK(store.get_string("k") == "v2");
  // An existing empty value matches an empty expected.
  store.set("e", "");
  CHECK(store.compare_set("e", "", "filled") == "filled");
  // To an empty value.
  CHECK(store.compare_set("e", "filled", "") == "");
  CHECK(store.check({"e"}));
  CHECK(store.get("e", 1s).empty());
}

TEST_CASE("add counts from zero and rejects values that are not integers") {
  TempDir dir;
  FileStore store(dir.path, {.world_size = 1});
  CHECK(store.add("n", 0) == 0);
  CHECK(store.add("n", 7) == 7);
  CHECK(store.add("n", -10) == -3);
  CHECK(store.get_string("n") == "-3");
  store.set("text", "twelve");
  CHECK_THROWS_WITH_AS(store.add("text", 1), doctest::Contains("'twelve' is not a decimal integer"),
                       ncclkit::StoreError);
  store.set("big", std::to_string(INT64_MAX));
  CHECK_THROWS_WITH_AS(store.add("big", 1), doctest::Contains("overflows"), ncclkit::StoreError);
}

TEST_CASE("threads of one process add atomically through one store") {
  TempDir dir;
  FileStore store(dir.path, {.world_size = 1});
  constexpr int kThreads = 4, kAdds = 100;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int i = 0; i < kAdds; ++i) store.add("sum", t + 1);
        store.set("done/" + std::to_string(t), "1");
      } catch (...) {
        ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(failures == 0);
  CHECK(store.add("sum", 0) == kAdds * kThreads * (kThreads + 1) / 2);
}

TEST_CASE("get and wait time out never early, late by at most max(10%, 250 ms), naming what is missing") {
  TempDir dir;
  FileStore store(dir.path, {.world_size = 1});
  store.set("present", "1");
  for (auto timeout : {0ms, 50ms, 300ms, 1200ms}) {
    CAPTURE(timeout.count());
    const double limit = std::chrono::duration<double>(timeout).count();
    const double slack = std::max(0.1 * limit, 0.25);
    auto start = Clock::now();
    try {
      (void)store.get("missing/key", timeout);
      FAIL("get of a missing key returned");
    } catch (const ncclkit::TimeoutError& e) {
      const double waited = seconds_since(start);
      CHECK(waited >= limit);
      CHECK(waited <= limit + slack);
      const std::string text = e.what();
      CHECK(text.find("'missing/key'") != std::string::npos);
      CHECK(text.find("file://" + dir.path) != std::string::npos);
      CHECK(text.find("timed out after") != std::string::npos);
    }
    start = Clock::now();
    try {
      store.wait({"present", "gone/1", "gone/2"}, timeout);
      FAIL("wait for missing keys returned");
    } catch (const ncclkit::TimeoutError& e) {
      const double waited = seconds_since(start);
      CHECK(waited >= limit);
      CHECK(waited <= limit + slack);
      const std::string text = e.what();
      CHECK(text.find("2 still missing: 'gone/1', 'gone/2'") != std::string::npos);
      CHECK(text.find("'present'") == std::string::npos);
      CHECK(text.find("file://" + dir.path) != std::string::npos);
    }
  }
}

TEST_CASE("the folder is created 0700 (with its parents) and every file is 0600") {
  TempDir dir;
  const mode_t old_mask = ::umask(022);
  const std::string nested = dir.path + "/a/b/rendezvous";
  {
    FileStore store(nested, {.world_size = 1});
    store.set("key", "value");
    store.add("counter", 3);
    store.set("big", random_bytes(1 << 20, 3));
    CHECK(mode_of(dir.path + "/a") == 0700);
    CHECK(mode_of(dir.path + "/a/b") == 0700);
    CHECK(mode_of(nested) == 0700);
    int files = 0, folders = 0;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(nested)) {
      CAPTURE(entry.path().string());
      if (entry.is_directory()) {
        CHECK(mode_of(entry.path().string()) == 0700);
        ++folders;
      } else {
        CHECK(mode_of(entry.path().string()) == 0600);
        ++files;
      }
    }
    CHECK(folders == 1);  // the run's folder
    CHECK(files == 7);    // lock, record, members, state, and the three keys
  }
  ::umask(old_mask);
}

TEST_CASE("the last of world_size members to leave removes the run's files") {
  TempDir dir;
  {
    auto first = std::make_unique<FileStore>(dir.path, ncclkit::FileStoreOptions{.world_size = 3});
    FileStore second(dir.path, {.world_size = 3});
    FileStore third(dir.path, {.world_size = 3});
    CHECK(second.run_id() == first->run_id());
    CHECK(third.run_id() == first->run_id());
    CHECK(third.member() == 2);
    first->set("k", "v");
    CHECK(third.get_string("k", 1s) == "v");
    first.reset();  // leaving early: the others keep the run
    CHECK(second.get_string("k", 1s) == "v");
    CHECK(entries(dir.path).size() == 2);  // lock, r-<id>
  }
  CHECK(entries(dir.path) == std::vector<std::string>{"lock"});
  // The folder is reusable at once.
  FileStore again(dir.path, {.world_size = 1});
  CHECK_FALSE(again.check({"k"}));
}

TEST_CASE("a complete run is never joined: a later arrival starts a fresh run beside it") {
  TempDir dir;
  FileStore first(dir.path, {.world_size = 1});
  first.set("k", "old");
  FileStore second(dir.path, {.world_size = 1});
  CHECK(second.run_id() != first.run_id());
  CHECK(second.member() == 0);
  CHECK_FALSE(second.check({"k"}));
  second.set("k", "new");
  CHECK(first.get_string("k") == "old");  // the first run carries on, undisturbed
  CHECK(second.get_string("k") == "new");
}

TEST_CASE("a live, incomplete run with another world size is a clear error") {
  TempDir dir;
  FileStore first(dir.path, {.world_size = 4});
  CHECK_THROWS_WITH_AS(FileStore(dir.path, {.world_size = 8}),
                       doctest::Contains("has world_size 4 and live members (1 of 4 joined"), ncclkit::ConfigError);
  // world_size 0 (unknown) joins whatever live run is there and adopts its size.
  FileStore unknown(dir.path, {.world_size = 0});
  CHECK(unknown.run_id() == first.run_id());
  CHECK(unknown.run_world_size() == 4);
}

TEST_CASE("a run whose members all left before it was complete is stale, never joined") {
  TempDir dir;
  std::string old_run;
  {
    FileStore early(dir.path, {.world_size = 3});
    early.set("k", "old");
    old_run = early.run_id();
  }
  CHECK(entries(dir.path).size() == 2);  // lock, r-<id>: incomplete, so not removed by its last leaver
  FileStore fresh(dir.path, {.world_size = 3});
  CHECK(fresh.run_id() != old_run);
  CHECK_FALSE(fresh.check({"k"}));
  CHECK_FALSE(std::filesystem::exists(dir.path + "/r-" + old_run));  // removed by the new run
}

TEST_CASE("world_size 0: members share the live run; nothing is removed until the next run finds it dead") {
  TempDir dir;
  std::string old_run;
  {
    FileStore a(dir.path);
    FileStore b(dir.path);
    CHECK(a.run_id() == b.run_id());
    CHECK(b.member() == 1);
    a.set("k", "v");
    CHECK(b.get_string("k", 1s) == "v");
    old_run = a.run_id();
  }
  CHECK(std::filesystem::exists(dir.path + "/r-" + old_run));
  FileStore next(dir.path);
  CHECK(next.run_id() != old_run);
  CHECK_FALSE(next.check({"k"}));
  CHECK_FALSE(std::filesystem::exists(dir.path + "/r-" + old_run));
}

TEST_CASE("bad arguments and unusable folders are clear errors") {
  CHECK_THROWS_AS(FileStore(""), ncclkit::ConfigError);
  TempDir dir;
  CHECK_THROWS_WITH_AS(FileStore(dir.path, {.world_size = -1}), doctest::Contains("world_size=-1"),
                       ncclkit::ConfigError);
  const std::string file = dir.path + "/plain-file";
  {
    std::FILE* f = std::fopen(file.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fclose(f);
  }
  // A regular file where the folder should be: PyTorch's file:// names a file, ours a folder.
  CHECK_THROWS_WITH_AS(
      FileStore{file},
      doctest::Contains((file + " is a regular file, but a FileStore (and a file:// init URL) names a folder").c_str()),
      ncclkit::ConfigError);
  CHECK_THROWS_WITH_AS(FileStore{file}, doctest::Contains("unlike PyTorch's FileStore, whose file:// names a file"),
                       ncclkit::ConfigError);
  // Below a regular file nothing can be created: that stays a StoreError about the folder.
  CHECK_THROWS_WITH_AS(FileStore{file + "/below"}, doctest::Contains("cannot create or use the rendezvous folder"),
                       ncclkit::StoreError);
}

TEST_CASE("files that are not FileStore's are left alone") {
  TempDir dir;
  std::filesystem::create_directory(dir.path + "/r-not-a-run");
  std::filesystem::create_directory(dir.path + "/r-0123456789abcdef0123456789abcdeg");  // 'g': not hex
  {
    std::FILE* f = std::fopen((dir.path + "/notes.txt").c_str(), "w");
    REQUIRE(f != nullptr);
    std::fclose(f);
  }
  {
    FileStore store(dir.path, {.world_size = 1});
    store.set("k", "v");
  }
  CHECK(entries(dir.path) ==
        std::vector<std::string>{"lock", "notes.txt", "r-0123456789abcdef0123456789abcdeg", "r-not-a-run"});
}

// ---- job identities: two jobs in one folder --------------------------------------------------

namespace {

/// Sets the variables a job identity is read from (a value of nullptr: unset) for the scope,
/// and restores them after.
class IdentityEnvironment {
 public:
  explicit IdentityEnvironment(std::vector<std::pair<const char*, const char*>> values) {
    for (const char* name : kNames) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old == nullptr ? std::nullopt : std::optional<std::string>(old));
      ::unsetenv(name);
    }
    for (const auto& [name, value] : values)
      if (value != nullptr) ::setenv(name, value, 1);
  }
  ~IdentityEnvironment() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name, value->c_str(), 1);
      } else {
        ::unsetenv(name);
      }
    }
  }
  IdentityEnvironment(const IdentityEnvironment&) = delete;
  IdentityEnvironment& operator=(const IdentityEnvironment&) = delete;

 private:
  static constexpr const char* kNames[] = {"NCCLKIT_RUN_ID", "NCCLKIT_LAUNCH_RUN_ID", "TORCHELASTIC_RUN_ID",
                                           "SLURM_JOB_ID", "SLURM_STEP_ID"};
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

/// A FileStore opened with `values` as the identity variables.
std::unique_ptr<FileStore> open_with(const std::string& dir, std::vector<std::pair<const char*, const char*>> values,
                                     int world_size = 2) {
  IdentityEnvironment environment(std::move(values));
  return std::make_unique<FileStore>(dir, ncclkit::FileStoreOptions{.world_size = world_size});
}

}  // namespace

TEST_CASE("the job identity comes from NCCLKIT_RUN_ID, ncclkit-run, torchrun or SLURM, first found wins") {
  struct Case {
    std::vector<std::pair<const char*, const char*>> values;
    std::string tag, source;
  };
  const std::vector<Case> cases = {
      {{}, "", ""},
      {{{"SLURM_JOB_ID", "77"}}, "slurm:77", "SLURM_JOB_ID=77"},
      // The step is not part of it: one job's processes may run in different steps.
      {{{"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "3"}}, "slurm:77", "SLURM_JOB_ID=77"},
      {{{"TORCHELASTIC_RUN_ID", "t-1"}, {"SLURM_JOB_ID", "77"}},
       "torchrun:t-1",
       "TORCHELASTIC_RUN_ID=t-1 (set by torchrun)"},
      // torchrun's default run id is the same for every job without --rdzv-id: not an identity.
      {{{"TORCHELASTIC_RUN_ID", "none"}, {"SLURM_JOB_ID", "77"}}, "slurm:77", "SLURM_JOB_ID=77"},
      {{{"TORCHELASTIC_RUN_ID", "none"}}, "", ""},
      {{{"NCCLKIT_LAUNCH_RUN_ID", "abc"}, {"TORCHELASTIC_RUN_ID", "t-1"}, {"SLURM_JOB_ID", "77"}},
       "ncclkit-run:abc",
       "NCCLKIT_LAUNCH_RUN_ID=abc (set by ncclkit-run)"},
      {{{"NCCLKIT_RUN_ID", "mine"},
        {"NCCLKIT_LAUNCH_RUN_ID", "abc"},
        {"TORCHELASTIC_RUN_ID", "t-1"},
        {"SLURM_JOB_ID", "77"}},
       "mine",
       "NCCLKIT_RUN_ID=mine"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.tag);
    TempDir dir;
    auto store = open_with(dir.path, c.values, 1);
    CHECK(store->identity().tag == c.tag);
    CHECK(store->identity().source == c.source);
  }
}

TEST_CASE("two jobs in one folder stay apart by the identity their environment gives, from every source") {
  using Values = std::vector<std::pair<const char*, const char*>>;
  struct Source {
    const char* name;
    Values job_a, job_b;
  };
  const std::vector<Source> sources = {
      {"SLURM_JOB_ID", {{"SLURM_JOB_ID", "101"}}, {{"SLURM_JOB_ID", "202"}}},
      {"TORCHELASTIC_RUN_ID", {{"TORCHELASTIC_RUN_ID", "a"}}, {{"TORCHELASTIC_RUN_ID", "b"}}},
      {"NCCLKIT_LAUNCH_RUN_ID", {{"NCCLKIT_LAUNCH_RUN_ID", "a"}}, {{"NCCLKIT_LAUNCH_RUN_ID", "b"}}},
      // An explicit NCCLKIT_RUN_ID wins over what the environment says.
      {"NCCLKIT_RUN_ID",
       {{"NCCLKIT_RUN_ID", "a"}, {"SLURM_JOB_ID", "7"}},
       {{"NCCLKIT_RUN_ID", "b"}, {"SLURM_JOB_ID", "7"}}},
  };
  for (const auto& source : sources) {
    const std::string source_name = source.name;
    CAPTURE(source_name);
    TempDir dir;
    // Arrivals interleave: a1, b1, a2, b2. Each second member must find its own job's run.
    auto a1 = open_with(dir.path, source.job_a);
    auto b1 = open_with(dir.path, source.job_b);
    auto a2 = open_with(dir.path, source.job_a);
    auto b2 = open_with(dir.path, source.job_b);
    CHECK(a1->run_id() != b1->run_id());
    CHECK(a2->run_id() == a1->run_id());
    CHECK(b2->run_id() == b1->run_id());
    a1->set("k", "a");
    b1->set("k", "b");
    CHECK(a2->get_string("k") == "a");
    CHECK(b2->get_string("k") == "b");
  }
}

TEST_CASE("an explicit NCCLKIT_RUN_ID joins processes whose environments disagree") {
  TempDir dir;
  auto first = open_with(dir.path, {{"NCCLKIT_RUN_ID", "one-job"}, {"SLURM_JOB_ID", "1"}});
  auto second = open_with(dir.path, {{"NCCLKIT_RUN_ID", "one-job"}, {"SLURM_JOB_ID", "2"}});
  CHECK(first->run_id() == second->run_id());
  CHECK(second->member() == 1);
}

TEST_CASE("processes of one SLURM job in different steps meet: the step is not part of the identity") {
  // One `srun -n1 ./prog` per rank, or mpirun under sbatch (the batch step on the first node,
  // an srun step on the others): each process in its own step, all of one job.
  TempDir dir;
  auto batch_step = open_with(dir.path, {{"SLURM_JOB_ID", "5"}}, 3);
  auto step_0 = open_with(dir.path, {{"SLURM_JOB_ID", "5"}, {"SLURM_STEP_ID", "0"}}, 3);
  auto step_1 = open_with(dir.path, {{"SLURM_JOB_ID", "5"}, {"SLURM_STEP_ID", "1"}}, 3);
  CHECK(step_0->run_id() == batch_step->run_id());
  CHECK(step_1->run_id() == batch_step->run_id());
  CHECK(step_1->member() == 2);
  batch_step->set("k", "from the batch step");
  CHECK(step_1->get_string("k", 5s) == "from the batch step");
}

TEST_CASE("a timeout names the live runs of other jobs in the folder and says how to join them") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  TempDir dir;
  auto other = open_with(dir.path, {{"SLURM_JOB_ID", "1"}});
  auto mine = open_with(dir.path, {{"SLURM_JOB_ID", "2"}});
  CHECK(mine->run_id() != other->run_id());
  const std::vector<std::string> keys{"peer"};
  for (int op = 0; op < 2; ++op) {
    CAPTURE(op);
    try {
      if (op == 0) (void)mine->get("peer", 50ms);
      if (op == 1) mine->wait(keys, 50ms);
      FAIL("no timeout");
    } catch (const ncclkit::TimeoutError& e) {
      const std::string text = e.what();
      CHECK_MESSAGE(contains_text(text, "of job slurm:2, member 0 of 2)"), text);
      CHECK_MESSAGE(
          contains_text(text, "The folder also holds live runs of other jobs, which this store never joins: run " +
                                  other->run_id().substr(0, 8) + " of job slurm:1 (started by "),
          text);
      CHECK(contains_text(text, "this process is job slurm:2 (from SLURM_JOB_ID=2)"));
      CHECK(contains_text(text, "give every process of the job the same NCCLKIT_RUN_ID"));
    }
  }
  // Without another job in the folder, the message has no such note.
  other.reset();
  try {
    (void)mine->get("peer", 50ms);
    FAIL("no timeout");
  } catch (const ncclkit::TimeoutError& e) {
    CHECK_FALSE(contains_text(e.what(), "other jobs"));
  }
}

TEST_CASE("a dead run of another job is removed by the next job, and a job's restart starts fresh") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  TempDir dir;
  std::string dead_run;
  {
    auto lone = open_with(dir.path, {{"SLURM_JOB_ID", "1"}});  // world 2: its run never completes
    lone->set("k", "old");
    dead_run = lone->run_id();
  }
  CHECK(std::filesystem::exists(dir.path + "/r-" + dead_run));
  auto next_job = open_with(dir.path, {{"SLURM_JOB_ID", "2"}});
  CHECK(next_job->run_id() != dead_run);
  CHECK_FALSE(std::filesystem::exists(dir.path + "/r-" + dead_run));
  next_job->set("k2", "before the restart");
  const std::string before_restart = next_job->run_id();
  next_job.reset();
  // The same job again (a restart): a fresh run, none of the old keys.
  auto restarted = open_with(dir.path, {{"SLURM_JOB_ID", "2"}});
  CHECK(restarted->run_id() != before_restart);
  CHECK_FALSE(restarted->check({"k2"}));
}

// ---- stale folders left by killed runs (real processes) ---------------------------------------

namespace {

/// Runs `n` workers on `dir`, each with FileStore(dir, {.world_size = n}).
template <class Fn>
ncclkit::SpawnResult run_on(const std::string& dir, int n, Fn fn) {
  return ncclkit::spawn(n,
                        [&](const ncclkit::WorldInfo& world) {
                          ::signal(SIGTERM,
                                   SIG_DFL);  // not doctest's handler, which would report a killed worker as a crash
                          FileStore store(world.init_url.substr(7), {.world_size = world.world_size, .timeout = 60s});
                          fn(store, world.rank, world.world_size);
                        },
                        {.timeout = 120s, .grace = 200ms, .rendezvous_dir = dir});
}

using ncclkit_test::require;

/// A second run in `dir`: must start fresh, see none of the old keys, count from zero, and
/// leave only the lock file behind.
void check_fresh_run(const std::string& dir, int n) {
  auto result = run_on(dir, n, [](FileStore& store, int rank, int world) {
    for (int r = 0; r < world; ++r) {
      require(!store.check({"key/" + std::to_string(r)}), "key/" + std::to_string(r) + " of the old run is visible");
    }
    require(!store.check({"counter"}), "the old run's counter is visible");
    ncclkit::barrier(store, rank, world, "checked-old", 30s);  // nobody sets a key before all checked
    store.set("key/" + std::to_string(rank), "new");
    store.add("counter", 1);
    ncclkit::barrier(store, rank, world, "after", 30s);
    require(store.get_string("counter") == std::to_string(world), "the counter did not restart from zero");
    for (int r = 0; r < world; ++r) require(store.get_string("key/" + std::to_string(r)) == "new", "old value read");
    // Only the new run's folder is left: the killed run's was removed.
    int runs = 0;
    for (const auto& entry : std::filesystem::directory_iterator(store.describe().substr(7)))
      runs += entry.path().filename().string().rfind("r-", 0) == 0;
    require(runs == 1, "the dead run's folder was not removed (" + std::to_string(runs) + " run folders)");
    ncclkit::barrier(store, rank, world, "checked", 30s);
  });
  CHECK_MESSAGE(result.ok(), result.describe());
  CHECK(entries(dir) == std::vector<std::string>{"lock"});
}

}  // namespace

TEST_CASE("a run SIGKILLed mid-run leaves a folder that the next run starts fresh in") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  TempDir dir;
  constexpr int kRanks = 8;
  auto killed = run_on(dir.path, kRanks, [](FileStore& store, int rank, int world) {
    store.set("key/" + std::to_string(rank), "old");
    store.add("counter", 1);
    ncclkit::barrier(store, rank, world, "ready", 30s);
    if (rank == 0) ::raise(SIGKILL);  // spawn then stops the others, wherever they are
    (void)store.get("never", 60s);
  });
  CHECK_FALSE(killed.ok());
  CHECK(killed.workers[0].signal == SIGKILL);
  CHECK(entries(dir.path).size() == 2);  // lock, and the dead run's folder
  check_fresh_run(dir.path, kRanks);
}

TEST_CASE("a run killed before all its members arrived is stale too, never joined") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  TempDir dir, side;
  constexpr int kRanks = 8, kArrived = 5;
  // Ranks 0..4 join `dir`; all ranks meet on a side folder so that rank 0 is killed only once
  // those five have set their keys.
  auto killed =
      ncclkit::spawn(kRanks,
                     [&](const ncclkit::WorldInfo& world) {
                       ::signal(SIGTERM, SIG_DFL);
                       FileStore coordination(side.path, {.world_size = kRanks, .timeout = 60s});
                       std::unique_ptr<FileStore> store;
                       if (world.rank < kArrived) {
                         store = std::make_unique<FileStore>(dir.path, ncclkit::FileStoreOptions{.world_size = kRanks});
                         store->set("key/" + std::to_string(world.rank), "old");
                       }
                       ncclkit::barrier(coordination, world.rank, kRanks, "arrived", 30s);
                       if (world.rank == 0) ::raise(SIGKILL);
                       (void)coordination.get("never", 60s);
                     },
                     {.timeout = 120s, .grace = 200ms});
  CHECK(killed.workers[0].signal == SIGKILL);
  check_fresh_run(dir.path, kRanks);
}
