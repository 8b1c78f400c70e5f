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
#include <string>      // std::string
#include <thread>      // std::thread
#include <vector>      // std::vector

#include "support/store_values.hpp"
#include "support/temp_dir.hpp"
#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/store/barrier.hpp"
#include "ncclkit/store/file_store.hpp"

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
  std::vector<std::string> keys = {"a/b",  "A/b", "a%2fb", "%41", "A",   std::string("nul\0byte", 8),
                                   "",     ".",   "..",    "/",   "\xff\xfe", "k-a", long_key, long_key_2,
                                   std::string(300, '/')};
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
  CHECK_THROWS_WITH_AS(store.add("text", 1), doctest::Contains("'twelve' is not a decimal integer"), ncclkit::StoreError);
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
  CHECK_THROWS_WITH_AS(FileStore(dir.path, {.world_size = -1}), doctest::Contains("world_size=-1"), ncclkit::ConfigError);
  const std::string file = dir.path + "/plain-file";
  { std::FILE* f = std::fopen(file.c_str(), "w"); REQUIRE(f != nullptr); std::fclose(f); }
  // A regular file where the folder should be: PyTorch's file:// names a file, ours a folder.
  CHECK_THROWS_WITH_AS(FileStore{file}, doctest::Contains((file + " is a regular file, but a FileStore (and a file:// init URL) names a folder").c_str()),
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
  { std::FILE* f = std::fopen((dir.path + "/notes.txt").c_str(), "w"); REQUIRE(f != nullptr); std::fclose(f); }
  { FileStore store(dir.path, {.world_size = 1}); store.set("k", "v"); }
  CHECK(entries(dir.path) == std::vector<std::string>{"lock", "notes.txt", "r-0123456789abcdef0123456789abcdeg", "r-not-a-run"});
}

TEST_CASE("two jobs sharing a folder at once stay apart when each has its own NCCLKIT_RUN_ID") {
  TempDir dir;
  auto open_as = [&](const char* job) {
    ::setenv("NCCLKIT_RUN_ID", job, 1);
    auto store = std::make_unique<FileStore>(dir.path, ncclkit::FileStoreOptions{.world_size = 2});
    ::unsetenv("NCCLKIT_RUN_ID");
    return store;
  };
  // Arrivals interleave: a1, b1, a2, b2. Each second member must find its own job's run.
  auto a1 = open_as("job-a");
  auto b1 = open_as("job-b");
  auto a2 = open_as("job-a");
  auto b2 = open_as("job-b");
  CHECK(a1->run_id() != b1->run_id());
  CHECK(a2->run_id() == a1->run_id());
  CHECK(b2->run_id() == b1->run_id());
  a1->set("k", "a");
  b1->set("k", "b");
  CHECK(a2->get_string("k") == "a");
  CHECK(b2->get_string("k") == "b");
}

// ---- stale folders left by killed runs (real processes) ---------------------------------------

namespace {

/// Runs `n` workers on `dir`, each with FileStore(dir, {.world_size = n}).
template <class Fn>
ncclkit::SpawnResult run_on(const std::string& dir, int n, Fn fn) {
  return ncclkit::spawn(n, [&](const ncclkit::WorldInfo& world) {
    ::signal(SIGTERM, SIG_DFL);  // not doctest's handler, which would report a killed worker as a crash
    FileStore store(world.init_url.substr(7), {.world_size = world.world_size, .timeout = 60s});
    fn(store, world.rank, world.world_size);
  }, {.timeout = 120s, .grace = 200ms, .rendezvous_dir = dir});
}

void require(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error(what);
}

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
    if (rank == 0) ::raise(SIGKILL);    // spawn then stops the others, wherever they are
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
  auto killed = ncclkit::spawn(kRanks, [&](const ncclkit::WorldInfo& world) {
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
  }, {.timeout = 120s, .grace = 200ms});
  CHECK(killed.workers[0].signal == SIGKILL);
  check_fresh_run(dir.path, kRanks);
}
