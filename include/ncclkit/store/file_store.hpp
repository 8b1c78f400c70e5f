#pragma once
/// FileStore: a Store kept in a folder, for processes on one host or on several hosts that
/// share the folder over NFS. No server, no address: every process polls the folder.
///
/// docs/filestore.md states the file-system contract it relies on (atomic rename,
/// close-to-open consistency, fcntl locks that work across clients) and the run scheme that
/// keeps it from ever reading the keys of an earlier run. In short:
///
///   dir/lock        byte 0: the folder lock, shared by processes joining or leaving a run,
///                   exclusive to one starting a run or removing dead ones;
///                   other bytes: one lock per key (set, add, compare_set, delete_key)
///   dir/r-<id>/     one folder per run (id: 128 random bits); every key of the run lives here
///       record      world size, tag (the job's identity), creator; written once
///       members     member i holds a lock on byte i for as long as it lives
///       m-<i>       slot i was claimed (created while holding byte i; never removed)
///       l-<i>       member i has left
///       k-<name>    a key (name escaped), h-<hash> for long keys
///   dir/.trash-<id> a run's folder being removed by its last member
///
/// A process joins a run of its own job (same identity: NCCLKIT_RUN_ID, or one the environment
/// gives, see store/run_identity.hpp) that still misses members and has a live member;
/// otherwise it starts a fresh run with a new random id, so the keys of a run that ended, was
/// killed, is complete or belongs to another job can never be read. The last of `world_size` members to leave removes its run's
/// folder; the folders of runs whose members all died are removed by the next process that
/// starts a run.
///
/// Thread safety: one FileStore may be used by several threads. Do not use one across fork():
/// the child would share its locks (and look alive while the parent is gone).
///
/// Its parts: detail/file_store_runs.hpp (joining and leaving runs), detail/file_lock.hpp
/// (byte locks), detail/file_io.hpp (descriptors, reads, writes, folder refreshes),
/// detail/key_files.hpp (key file names), detail/run_records.hpp, detail/mount_table.hpp
/// (mount options that break the guarantees), detail/hash_ids.hpp (hashes, run ids).

#include <dirent.h>    // opendir, readdir, closedir
#include <fcntl.h>     // O_* flags, AT_FDCWD
#include <sys/stat.h>  // fstat, fstatat, mkdir
#include <unistd.h>    // close, renameat, unlinkat, getpid

#include <algorithm>      // std::find, std::equal
#include <atomic>         // std::atomic
#include <cerrno>         // errno
#include <chrono>         // std::chrono
#include <cstdint>        // std::uint64_t, std::int64_t
#include <cstring>        // std::memcmp
#include <mutex>          // std::mutex, std::unique_lock
#include <optional>       // std::optional
#include <span>           // std::span
#include <string>         // std::string
#include <string_view>    // std::string_view
#include <unordered_set>  // std::unordered_set (wait's folder listing)
#include <vector>         // std::vector

#include "ncclkit/core/detail/deadline.hpp"
#include "ncclkit/core/knobs.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/detail/poll.hpp"
#include "ncclkit/core/time_format.hpp"
#include "ncclkit/store/detail/file_io.hpp"
#include "ncclkit/store/detail/file_lock.hpp"
#include "ncclkit/store/detail/hash_ids.hpp"
#include "ncclkit/store/detail/key_files.hpp"
#include "ncclkit/store/detail/mount_table.hpp"
#include "ncclkit/store/run_identity.hpp"
#include "ncclkit/store/store.hpp"

namespace ncclkit {

/// Options of a FileStore.
struct FileStoreOptions {
  /// Number of processes that will use this folder as one run; 0 = unknown. With a known world
  /// size a run is complete once that many processes joined (later arrivals start a new run)
  /// and the last of them to leave removes the run's files; with 0 neither happens (files of a
  /// finished run are removed by the next run that finds its members gone).
  int world_size = 0;
  /// Default timeout of blocking calls, and of taking a lock in the non-blocking ones.
  /// NCCLKIT_STORE_TIMEOUT overrides it.
  std::chrono::milliseconds timeout = knob_default<std::chrono::milliseconds>("NCCLKIT_STORE_TIMEOUT");
};

namespace detail::file_store {

using Clock = std::chrono::steady_clock;

/// Polling a key starts at 100 µs and doubles up to 20 ms: a rendezvous of processes that
/// arrive together completes within a few hundred µs, a long wait costs at most 50 polls a second.
inline constexpr BackoffPolicy kKeyPoll{.first = std::chrono::microseconds(100),
                                        .cap = std::chrono::microseconds(20000)};
/// wait() looks up each missing key when at most this many are missing, else lists the folder.
inline constexpr std::size_t kSweepByLookup = 8;

}  // namespace detail::file_store

/// A Store in a folder; see the top of this file and docs/filestore.md.
///
/// Keys may hold any bytes, values any size (0 B to many MiB). set/add/compare_set/delete_key
/// are atomic across processes and hosts; get/wait poll with backoff (100 µs up to 20 ms).
/// Construction joins a live run that still misses members, or starts a new one; it never
/// waits for other processes (only, briefly, for the folder lock).
class FileStore final : public Store {
 public:
  /// Opens (creating it with mode 0700 if missing) the rendezvous folder `dir` and joins the
  /// run there that still misses members and has a live member, or starts a fresh run.
  /// Throws ConfigError for a bad argument or when the folder's live, incomplete run was
  /// started with another world size; StoreError when the folder cannot be used;
  /// TimeoutError when the folder lock stays taken past the timeout.
  explicit FileStore(std::string dir, FileStoreOptions options = {});

  /// Leaves the run; the last of `world_size` members to leave removes the run's files.
  /// Never throws (problems are logged).
  /// (The virtual members are declared `inline` here, not only where they are defined below:
  /// otherwise the destructor is the class's key function, and every file that includes this
  /// header compiles the vtable and all the store's code, about 4 s of g++ -O2 each.)
  inline ~FileStore() override;

  using Store::check;
  using Store::compare_set;
  using Store::get;
  using Store::set;
  using Store::wait;

  inline void set(std::string_view key, std::span<const std::uint8_t> value) override;
  inline Bytes get(std::string_view key, Duration timeout) override;
  inline void wait(std::span<const std::string> keys, Duration timeout) override;
  inline bool check(std::span<const std::string> keys) override;
  inline std::int64_t add(std::string_view key, std::int64_t delta) override;
  inline Bytes compare_set(std::string_view key, std::span<const std::uint8_t> expected,
                           std::span<const std::uint8_t> desired) override;
  inline bool delete_key(std::string_view key) override;
  inline std::int64_t num_keys() override;
  std::string describe() const override { return "file://" + dir_; }

  /// The run this store joined: 32 hex digits, new for every fresh run.
  const std::string& run_id() const { return run_id_; }
  /// This process's place in the run, in order of arrival (0 started the run).
  int member() const { return member_; }
  /// The run's world size (0 = unknown), as its first member set it.
  int run_world_size() const { return run_world_size_; }
  /// The job identity this store's runs are matched by (store/run_identity.hpp): its tag
  /// ("slurm:77"; empty when the environment gives none) and where it came from.
  const RunIdentity& identity() const { return identity_; }

 private:
  using Clock = detail::file_store::Clock;

  /// "FileStore file:///dir (run 1a2b3c4d of job slurm:77, member 2 of 8)".
  std::string where() const {
    return "FileStore " + describe() + " (run " + run_id_.substr(0, 8) +
           (identity_.tag.empty() ? "" : " of job " + identity_.tag) + ", member " + std::to_string(member_) +
           (run_world_size_ > 0 ? " of " + std::to_string(run_world_size_) : "") + ")";
  }
  /// "This process is job slurm:77 (from SLURM_JOB_ID=77)" / "has no job identity (...)".
  std::string our_identity() const {
    if (identity_.tag.empty()) {
      return "this process has no job identity (no NCCLKIT_RUN_ID, NCCLKIT_LAUNCH_RUN_ID, TORCHELASTIC_RUN_ID or "
             "SLURM_JOB_ID)";
    }
    return "this process is job " + identity_.tag + " (from " + identity_.source + ")";
  }
  /// After a timeout: the live runs of other jobs in the folder, which may be the peers this
  /// process waits for when the processes of one job were given different identities.
  std::string other_jobs_note();

  void join();
  bool join_existing_run(std::string& mismatch);
  int claim_slot(int run_fd, int members_fd, int world_size, const std::string& run_path);
  void start_run();
  void remove_dead_runs();
  std::vector<std::string> list_runs(std::string_view prefix = "r-") const;
  void leave() noexcept;

  detail::file_store::ByteLock lock_folder(short type, Clock::time_point deadline, const char* purpose);
  detail::file_store::ByteLock lock_key(std::string_view key, const char* op);
  /// Makes the next lookups in the run's folder see other hosts' changes (see refresh_folder);
  /// throws StoreError when the folder is gone.
  void refresh_run_folder() const;
  /// refresh_folder where it matters (network file systems), a no-op elsewhere.
  void refresh(const std::string& path) const {
    if (refresh_) detail::file_store::refresh_folder(path);
  }
  void sweep(std::vector<std::string>& missing) const;
  std::optional<Bytes> read_key(const std::string& name, std::string_view key) const;
  std::string write_temp(std::string_view key, const std::string& name, std::span<const std::uint8_t> value);
  void commit(const std::string& temp, const std::string& name, std::string_view key, const char* op);
  [[noreturn]] void fail(const char* op, std::string_view key, const std::string& what, int err) const;

  std::string dir_;
  FileStoreOptions options_;
  RunIdentity identity_;              ///< a run is joined only by processes with the same tag
  detail::file_store::Fd lock_fd_;    ///< dir/lock
  detail::file_store::Fd run_fd_;     ///< dir/r-<id>
  detail::file_store::Fd member_fd_;  ///< dir/r-<id>/members, our byte locked while we live
  std::string run_id_;
  std::string run_path_;
  int member_ = -1;
  int run_world_size_ = 0;
  std::uint64_t key_lock_seed_ = 0;
  std::mutex key_mutex_;  ///< locks taken through one description do not exclude our own threads
  std::string temp_token_ = detail::file_store::random_hex_id().substr(0, 12);
  bool refresh_ = true;  ///< whether folders need refreshing (not on local file systems)
  std::atomic<std::uint64_t> temp_counter_{0};
};

// ---- construction ---------------------------------------------------------------------------

inline FileStore::FileStore(std::string dir, FileStoreOptions options) : dir_(std::move(dir)), options_(options) {
  namespace fs = detail::file_store;
  if (dir_.empty())
    throw ConfigError("FileStore: the rendezvous folder path is empty; pass a folder such as /tmp/job-42");
  if (options_.world_size < 0) {
    throw ConfigError("FileStore " + describe() + ": world_size=" + std::to_string(options_.world_size) +
                      " must be >= 0 (0 = unknown)");
  }
  options_.timeout = environment_overrides(knob("NCCLKIT_STORE_TIMEOUT"), options_.timeout);
  if (options_.timeout.count() < 0) {
    throw ConfigError("FileStore " + describe() + ": the timeout must not be negative");
  }
  set_default_timeout(options_.timeout);
  identity_ = run_identity_from_environment();

  if (int err = fs::make_folders(dir_); err != 0) {
    if (struct stat info{}; err == ENOTDIR && ::stat(dir_.c_str(), &info) == 0 && S_ISREG(info.st_mode)) {
      throw ConfigError("FileStore " + describe() + ": " + dir_ + " is a regular file, but a FileStore (and a " +
                        "file:// init URL) names a folder, in which it keeps one file per key (unlike PyTorch's " +
                        "FileStore, whose file:// names a file); give a folder path, e.g. file://" + dir_ + ".d");
    }
    throw StoreError("FileStore " + describe() + ": cannot create or use the rendezvous folder: " +
                     fs::describe_errno(err) + "; choose a folder this user can write");
  }
  lock_fd_ = fs::Fd(fs::open_at(AT_FDCWD, (dir_ + "/lock").c_str(), O_RDWR | O_CREAT, 0600));
  if (!lock_fd_) {
    throw StoreError("FileStore " + describe() + ": cannot open its lock file " + dir_ +
                     "/lock: " + fs::describe_errno(errno));
  }
  if (auto warning = fs::mount_warning(dir_); !warning.empty()) log_warn("FileStore: " + warning);
  refresh_ = fs::always_refresh_folders().load() || !fs::is_local_file_system(lock_fd_.get());
  join();
}

// ---- key operations ---------------------------------------------------------------------------

[[noreturn]] inline void FileStore::fail(const char* op, std::string_view key, const std::string& what, int err) const {
  throw StoreError(where() + ": " + op + " of key " + detail::file_store::quote_key(key) + " failed: " + what +
                   (err != 0 ? ": " + detail::file_store::describe_errno(err) : std::string()));
}

inline void FileStore::refresh_run_folder() const {
  struct stat info {};
  const bool gone = refresh_ ? detail::file_store::refresh_folder(run_path_) == ENOENT
                             : ::fstat(run_fd_.get(), &info) == 0 && info.st_nlink == 0;
  if (gone) {
    throw StoreError(where() + ": the run's folder " + run_path_ +
                     " is gone (removed while this store used it: by hand, or by a run that found no "
                     "member of this one alive, e.g. after the processes were suspended for long)");
  }
}

inline detail::file_store::ByteLock FileStore::lock_key(std::string_view key, const char* op) {
  namespace fs = detail::file_store;
  const off_t offset =
      1 + static_cast<off_t>(fs::hash64(key, key_lock_seed_) % static_cast<std::uint64_t>(fs::kKeyLockSpan));
  const auto start = Clock::now();
  const auto deadline = detail::deadline_after(default_timeout(), start);
  int err = fs::lock_byte_until(lock_fd_.get(), offset, deadline);
  if (err == ETIMEDOUT) {
    throw TimeoutError(where() + ": " + op + " of key " + fs::quote_key(key) +
                       " could not take the key's lock within " + format_seconds(Clock::now() - start) +
                       "; a process holding it may be stopped, or the file server unreachable");
  }
  if (err != 0) fail(op, key, "cannot lock " + dir_ + "/lock", err);
  return fs::ByteLock(lock_fd_.get(), offset);
}

inline std::optional<Bytes> FileStore::read_key(const std::string& name, std::string_view key) const {
  namespace fs = detail::file_store;
  fs::Fd fd(fs::open_at(run_fd_.get(), name.c_str(), O_RDONLY));
  if (!fd) {
    if (errno == ENOENT) return std::nullopt;
    fail("read", key, "cannot open " + run_path_ + "/" + name, errno);
  }
  Bytes value;
  if (int err = fs::read_all(fd.get(), value); err != 0)
    fail("read", key, "cannot read " + run_path_ + "/" + name, err);
  if (name[0] == 'h') {  // long key: verify the key stored in front of the value
    const std::string header = fs::hashed_key_header(key);
    if (value.size() < header.size() + 1 || std::memcmp(value.data(), header.data(), header.size()) != 0 ||
        value[header.size()] != '\n') {
      fail("read", key, "the file " + run_path_ + "/" + name + " holds another key (a hash collision of long keys)", 0);
    }
    value.erase(value.begin(), value.begin() + static_cast<std::ptrdiff_t>(header.size() + 1));
  }
  return value;
}

inline std::string FileStore::write_temp(std::string_view key, const std::string& name,
                                         std::span<const std::uint8_t> value) {
  namespace fs = detail::file_store;
  // Unique across hosts (the random token), forked processes (the pid) and threads (the counter).
  const std::string temp =
      ".t-" + temp_token_ + "-" + std::to_string(::getpid()) + "-" + std::to_string(temp_counter_.fetch_add(1));
  fs::Fd fd(fs::open_at(run_fd_.get(), temp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600));
  if (!fd) fail("write", key, "cannot create a temp file in " + run_path_, errno);
  int err = 0;
  if (name[0] == 'h') {
    const std::string header = fs::hashed_key_header(key) + "\n";
    err = fs::write_all(fd.get(), reinterpret_cast<const std::uint8_t*>(header.data()), header.size());
  }
  if (err == 0) err = fs::write_all(fd.get(), value.data(), value.size());
  // close() is where NFS sends the data to the server (close-to-open), so its error counts.
  if (err == 0 && ::close(fd.release()) != 0 && errno != EINTR) err = errno;
  if (err != 0) {
    ::unlinkat(run_fd_.get(), temp.c_str(), 0);
    fail("write", key,
         "cannot write " + std::to_string(value.size()) + " bytes to " + run_path_ + "/" + temp +
             (err == ENOSPC ? " (the file system is full)" : ""),
         err);
  }
  return temp;
}

inline void FileStore::commit(const std::string& temp, const std::string& name, std::string_view key, const char* op) {
  if (::renameat(run_fd_.get(), temp.c_str(), run_fd_.get(), name.c_str()) == 0) return;
  const int err = errno;
  // Over NFS a retransmitted rename whose first try succeeded reports ENOENT: our temp file is
  // gone then, and nobody but us touches it.
  struct stat info {};
  if (err == ENOENT && ::fstatat(run_fd_.get(), temp.c_str(), &info, 0) != 0 && errno == ENOENT &&
      ::fstatat(run_fd_.get(), name.c_str(), &info, 0) == 0) {
    return;
  }
  ::unlinkat(run_fd_.get(), temp.c_str(), 0);
  fail(op, key, "cannot rename " + temp + " to " + name + " in " + run_path_, err);
}

inline void FileStore::set(std::string_view key, std::span<const std::uint8_t> value) {
  const std::string name = detail::file_store::key_file_name(key);
  const std::string temp = write_temp(key, name, value);
  try {
    // The rename happens under the key's lock so that a set never lands between the read and
    // the write of a concurrent add or compare_set (which would lose it).
    std::unique_lock<std::mutex> guard(key_mutex_);
    auto lock = lock_key(key, "set");
    commit(temp, name, key, "set");
  } catch (...) {
    ::unlinkat(run_fd_.get(), temp.c_str(), 0);
    throw;
  }
}

inline Bytes FileStore::get(std::string_view key, Duration timeout) {
  namespace fs = detail::file_store;
  const std::string name = fs::key_file_name(key);
  const auto start = Clock::now();
  const auto deadline = detail::deadline_after(timeout, start);
  std::optional<Bytes> value;
  if (detail::poll_until(deadline, fs::kKeyPoll, [&] {
        refresh_run_folder();
        return (value = read_key(name, key)).has_value();
      })) {
    return std::move(*value);
  }
  throw TimeoutError(where() + ": get of key " + fs::quote_key(key) + " timed out after " +
                     format_seconds(Clock::now() - start) + " (timeout " + format_seconds(timeout) +
                     "): the key does not exist. Is the process that sets it running, and using " + dir_ + "?" +
                     other_jobs_note());
}

inline void FileStore::wait(std::span<const std::string> keys, Duration timeout) {
  namespace fs = detail::file_store;
  const auto start = Clock::now();
  const auto deadline = detail::deadline_after(timeout, start);
  std::vector<std::string> missing;  // file names of the keys not seen yet, in the caller's order
  missing.reserve(keys.size());
  for (const auto& key : keys) missing.push_back(fs::key_file_name(key));
  // A poll looks up only the first missing key; when it has appeared, all missing keys are
  // swept (by one folder listing when there are many). So a poll costs one lookup while
  // nothing changes, and waiting for N keys costs O(N) lookups, not O(N) per poll.
  const bool all_present = detail::poll_until(deadline, fs::kKeyPoll, [&] {
    refresh_run_folder();
    bool front_present = true;
    if (struct stat info{}; !missing.empty() && ::fstatat(run_fd_.get(), missing.front().c_str(), &info, 0) != 0) {
      if (errno != ENOENT) {
        throw StoreError(where() + ": wait cannot look up " + run_path_ + "/" + missing.front() + ": " +
                         fs::describe_errno(errno));
      }
      front_present = false;
    }
    if (front_present) sweep(missing);
    return missing.empty();
  });
  if (all_present) return;
  sweep(missing);  // name every key still missing, not just the first
  std::string names;
  std::size_t shown = 0;
  for (const auto& key : keys) {
    if (std::find(missing.begin(), missing.end(), fs::key_file_name(key)) == missing.end()) continue;
    if (shown++ < 32) names += (names.empty() ? "" : ", ") + fs::quote_key(key);
  }
  if (missing.size() > 32) names += ", ... (" + std::to_string(missing.size()) + " in all)";
  throw TimeoutError(where() + ": wait for " + std::to_string(keys.size()) + " key(s) timed out after " +
                     format_seconds(Clock::now() - start) + " (timeout " + format_seconds(timeout) + "); " +
                     std::to_string(missing.size()) + " still missing: " + names +
                     ". Are the processes that set them running, and using " + dir_ + "?" + other_jobs_note());
}

/// Drops from `missing` the names of key files that exist now.
inline void FileStore::sweep(std::vector<std::string>& missing) const {
  namespace fs = detail::file_store;
  if (missing.size() <= fs::kSweepByLookup) {
    std::erase_if(missing, [&](const std::string& name) {
      struct stat info {};
      return ::fstatat(run_fd_.get(), name.c_str(), &info, 0) == 0;
    });
    return;
  }
  std::unordered_set<std::string> present;
  DIR* listing = ::opendir(run_path_.c_str());
  if (listing == nullptr) throw StoreError(where() + ": cannot list " + run_path_ + ": " + fs::describe_errno(errno));
  while (dirent* entry = ::readdir(listing)) {
    if (fs::is_key_file_name(entry->d_name)) present.emplace(entry->d_name);
  }
  ::closedir(listing);
  std::erase_if(missing, [&](const std::string& name) { return present.count(name) != 0; });
}

inline bool FileStore::check(std::span<const std::string> keys) {
  refresh_run_folder();
  for (const auto& key : keys) {
    struct stat info {};
    const std::string name = detail::file_store::key_file_name(key);
    if (::fstatat(run_fd_.get(), name.c_str(), &info, 0) != 0) {
      if (errno == ENOENT) return false;
      fail("check", key, "cannot look up " + run_path_ + "/" + name, errno);
    }
  }
  return true;
}

inline std::int64_t FileStore::add(std::string_view key, std::int64_t delta) {
  namespace fs = detail::file_store;
  const std::string name = fs::key_file_name(key);
  std::unique_lock<std::mutex> guard(key_mutex_);
  auto lock = lock_key(key, "add");
  refresh_run_folder();
  std::int64_t value = 0;
  if (auto current = read_key(name, key)) {
    const std::string text(current->begin(), current->end());
    auto parsed = parse_int(text);
    if (!parsed) {
      throw StoreError(where() + ": add to key " + fs::quote_key(key) + ": its value " + fs::quote_key(text) +
                       " is not a decimal integer (it was set by set(), not add()); use another key for the counter");
    }
    value = *parsed;
  }
  if ((delta > 0 && value > INT64_MAX - delta) || (delta < 0 && value < INT64_MIN - delta)) {
    throw StoreError(where() + ": add of " + std::to_string(delta) + " to key " + fs::quote_key(key) + " (value " +
                     std::to_string(value) + ") overflows int64");
  }
  value += delta;
  const std::string text = std::to_string(value);
  const std::string temp = write_temp(
      key, name, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
  commit(temp, name, key, "add");
  return value;
}

inline Bytes FileStore::compare_set(std::string_view key, std::span<const std::uint8_t> expected,
                                    std::span<const std::uint8_t> desired) {
  const std::string name = detail::file_store::key_file_name(key);
  std::unique_lock<std::mutex> guard(key_mutex_);
  auto lock = lock_key(key, "compare_set");
  refresh_run_folder();
  auto current = read_key(name, key);
  if (!current && !expected.empty()) return Bytes(expected.begin(), expected.end());
  if (current && !std::equal(current->begin(), current->end(), expected.begin(), expected.end())) return *current;
  commit(write_temp(key, name, desired), name, key, "compare_set");
  return Bytes(desired.begin(), desired.end());
}

inline bool FileStore::delete_key(std::string_view key) {
  const std::string name = detail::file_store::key_file_name(key);
  std::unique_lock<std::mutex> guard(key_mutex_);
  auto lock = lock_key(key, "delete_key");
  refresh_run_folder();
  if (::unlinkat(run_fd_.get(), name.c_str(), 0) == 0) return true;
  if (errno == ENOENT) return false;
  fail("delete_key", key, "cannot remove " + run_path_ + "/" + name, errno);
}

inline std::int64_t FileStore::num_keys() {
  refresh_run_folder();
  DIR* listing = ::opendir(run_path_.c_str());
  if (listing == nullptr) {
    throw StoreError(where() + ": num_keys cannot list " + run_path_ + ": " +
                     detail::file_store::describe_errno(errno));
  }
  std::int64_t count = 0;
  while (dirent* entry = ::readdir(listing)) {
    if (detail::file_store::is_key_file_name(entry->d_name)) ++count;
  }
  ::closedir(listing);
  return count;
}

}  // namespace ncclkit

// FileStore's run membership: joining, starting and leaving runs (its members defined there).
#include "ncclkit/store/detail/file_store_runs.hpp"
