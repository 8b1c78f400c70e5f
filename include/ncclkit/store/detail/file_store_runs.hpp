#pragma once
/// FileStore's run membership, the members of FileStore (store/file_store.hpp) that join a
/// run, start one, remove dead ones and leave: the run scheme of docs/filestore.md. A run is
/// joined under the folder lock held shared, started under it held exclusively; a member
/// lives while it holds its byte of the run's members file.
///
/// file_store.hpp includes this header after the class; included first, this header includes
/// file_store.hpp, which declares the class and skips its include of this one.

#include <dirent.h>    // opendir, readdir, closedir
#include <fcntl.h>     // O_* flags, AT_FDCWD, F_RDLCK, F_WRLCK
#include <sys/stat.h>  // mkdir, fstatat
#include <unistd.h>    // close, gethostname, getpid

#include <algorithm>     // std::min, std::sort
#include <cerrno>        // errno
#include <chrono>        // std::chrono
#include <exception>     // std::exception
#include <filesystem>    // std::filesystem::remove_all
#include <string>        // std::string
#include <string_view>   // std::string_view
#include <system_error>  // std::error_code
#include <vector>        // std::vector

#include "ncclkit/core/detail/deadline.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/time_format.hpp"
#include "ncclkit/store/detail/file_io.hpp"
#include "ncclkit/store/detail/file_lock.hpp"
#include "ncclkit/store/detail/hash_ids.hpp"
#include "ncclkit/store/detail/key_files.hpp"
#include "ncclkit/store/detail/run_records.hpp"
#include "ncclkit/store/file_store.hpp"

namespace ncclkit {

// ---- joining a run ----------------------------------------------------------------------------

inline detail::file_store::ByteLock FileStore::lock_folder(short type, Clock::time_point deadline,
                                                           const char* purpose) {
  namespace fs = detail::file_store;
  const auto start = Clock::now();
  int err = fs::lock_byte_until(lock_fd_.get(), 0, deadline, type);
  if (err == ETIMEDOUT) {
    throw TimeoutError("FileStore " + describe() + ": could not take the folder lock (" + dir_ + "/lock, byte 0) to " +
                       purpose + " within " + format_seconds(Clock::now() - start) +
                       "; a process holding it may be stopped, or the file server unreachable");
  }
  if (err != 0) {
    throw StoreError(
        "FileStore " + describe() + ": cannot lock " + dir_ + "/lock to " + purpose + ": " + fs::describe_errno(err) +
        (err == ENOLCK || err == EOPNOTSUPP ? " (this file system offers no fcntl locks; on NFS run lockd or use NFSv4)"
                                            : ""));
  }
  return fs::ByteLock(lock_fd_.get(), 0);
}

/// Run ids of the folder's run folders ("r-<id>", or "<prefix><id>"), sorted so that every
/// process scans them in one order.
inline std::vector<std::string> FileStore::list_runs(std::string_view prefix) const {
  namespace fs = detail::file_store;
  std::vector<std::string> ids;
  DIR* listing = ::opendir(dir_.c_str());
  if (listing == nullptr) {
    throw StoreError("FileStore " + describe() + ": cannot list the rendezvous folder: " + fs::describe_errno(errno));
  }
  while (dirent* entry = ::readdir(listing)) {
    const std::string_view name = entry->d_name;
    if (name.substr(0, prefix.size()) == prefix &&
        fs::is_run_folder_name("r-" + std::string(name.substr(prefix.size()))))
      ids.emplace_back(name.substr(prefix.size()));
  }
  ::closedir(listing);
  std::sort(ids.begin(), ids.end());
  return ids;
}

/// Joins the run this process belongs to, or starts one:
///   1. under the folder lock held shared (so joins and leaves run in parallel), join a run
///      with our tag (the job identity, see run_identity.hpp) that has a live member and a
///      free slot;
///   2. failing that, under the folder lock held exclusively: remove the folders of runs with
///      no live member, try step 1 again (someone may have started our run meanwhile), and
///      otherwise start a new run with a fresh random id, as its member 0.
/// A dead run (no member alive) is never joined, and neither is a full one, so a new run never
/// sees the keys of a run that was killed, has ended or belongs to others.
inline void FileStore::join() {
  namespace fs = detail::file_store;
  const auto deadline = detail::deadline_after(options_.timeout);
  std::string mismatch;
  {
    auto shared = lock_folder(F_RDLCK, deadline, "join a run");
    if (join_existing_run(mismatch)) return;
  }
  auto exclusive = lock_folder(F_WRLCK, deadline, "start a run");
  remove_dead_runs();
  mismatch.clear();
  if (join_existing_run(mismatch)) return;
  if (!mismatch.empty()) {
    throw ConfigError("FileStore " + describe() + ": the folder's " + mismatch +
                      ", but this process was given world_size " + std::to_string(options_.world_size) +
                      "; all processes of a job must pass the same world size, and two jobs must not share a folder "
                      "at once (" +
                      our_identity() + "; use another folder, or give each job its own NCCLKIT_RUN_ID)");
  }
  start_run();
}

/// Step 1 of join(): scans the runs and claims a slot in the first joinable one. Sets
/// `mismatch` when a live run with our tag and free slots has another world size.
inline bool FileStore::join_existing_run(std::string& mismatch) {
  namespace fs = detail::file_store;
  const std::string my_tag = fs::escape_key(identity_.tag);
  for (const auto& id : list_runs()) {
    const std::string path = dir_ + "/r-" + id;
    refresh(path);
    int err = 0;
    auto text = fs::read_text(AT_FDCWD, (path + "/record").c_str(), err);
    auto record = text ? fs::parse_record(*text) : std::nullopt;
    if (!record || record->id != id || record->tag != my_tag) continue;
    fs::Fd members(fs::open_at(AT_FDCWD, (path + "/members").c_str(), O_RDWR));
    fs::Fd run_fd(fs::open_at(AT_FDCWD, path.c_str(), O_RDONLY | O_DIRECTORY));
    if (!members || !run_fd) continue;  // removed meanwhile
    const int alive = fs::any_lock_held(members.get());
    if (alive < 0) {
      throw StoreError(
          "FileStore " + describe() + ": cannot test the locks of " + path + "/members: " + fs::describe_errno(-alive) +
          (-alive == ENOLCK ? " (this file system offers no fcntl locks; on NFS run lockd or use NFSv4)" : ""));
    }
    if (alive == 0) continue;  // dead: never joined
    if (options_.world_size > 0 && record->world_size > 0 && options_.world_size != record->world_size) {
      int claimed = 0;
      for (int i = 0; i < record->world_size; ++i) {
        struct stat info {};
        claimed += ::fstatat(run_fd.get(), ("m-" + std::to_string(i)).c_str(), &info, 0) == 0;
      }
      if (claimed < record->world_size) {
        mismatch = "run " + id.substr(0, 8) + " (started by " + record->creator + ") has world_size " +
                   std::to_string(record->world_size) + " and live members (" + std::to_string(claimed) + " of " +
                   std::to_string(record->world_size) + " joined)";
      }
      continue;
    }
    const int slot = claim_slot(run_fd.get(), members.get(), record->world_size, path);
    if (slot < 0) continue;  // full
    run_fd_ = std::move(run_fd);
    member_fd_ = std::move(members);
    run_id_ = id;
    run_path_ = path;
    member_ = slot;
    run_world_size_ = record->world_size;
    key_lock_seed_ = fs::hash64(run_id_, 0);
    return true;
  }
  return false;
}

/// Claims the lowest free member slot of a run: a slot is ours once we hold its byte lock and
/// created its m-<i> file, which nobody removes; so a slot is never given twice, even after
/// its first owner left. Returns the slot, or -1 when all `world_size` slots are taken
/// (world_size 0: no limit).
inline int FileStore::claim_slot(int run_fd, int members_fd, int world_size, const std::string& run_path) {
  namespace fs = detail::file_store;
  auto claimed = [&](int i) {
    struct stat info {};
    return ::fstatat(run_fd, ("m-" + std::to_string(i)).c_str(), &info, 0) == 0;
  };
  auto try_claim = [&](int i) {
    if (claimed(i)) return false;
    const int err = fs::try_lock_byte(members_fd, i);
    if (err == EAGAIN || err == EACCES) return false;  // another process is claiming it right now
    if (err != 0) {
      throw StoreError("FileStore " + describe() + ": cannot lock " + run_path +
                       "/members: " + fs::describe_errno(err));
    }
    // Look again now that we hold the byte: its previous holder may have claimed it and left.
    refresh(run_path);
    const std::string claim = "m-" + std::to_string(i);
    int create_err = EEXIST;
    if (!claimed(i)) {
      fs::Fd marker(fs::open_at(run_fd, claim.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600));
      if (marker) return true;
      create_err = errno;
    }
    fs::unlock_byte(members_fd, i);
    if (create_err != EEXIST) {
      throw StoreError("FileStore " + describe() + ": cannot create " + run_path + "/" + claim + ": " +
                       fs::describe_errno(create_err));
    }
    return false;
  };
  // Slots are claimed nearly in order, so the first free one is found by binary search (256
  // joiners cost 256 log 256 lookups, not 256^2/2); free slots below it (their claimer is at
  // work right now, or died) are tried last.
  int low = 0, high = world_size;
  if (world_size == 0) {
    high = 1;
    while (claimed(high - 1)) high *= 2;
  }
  while (low < high) {
    const int middle = low + (high - low) / 2;
    if (claimed(middle)) {
      low = middle + 1;
    } else {
      high = middle;
    }
  }
  for (int i = low; world_size == 0 || i < world_size; ++i)
    if (try_claim(i)) return i;
  for (int i = 0; i < low; ++i)
    if (try_claim(i)) return i;
  return -1;
}

/// Starts a new run with us as member 0. Called with the folder lock held exclusively.
inline void FileStore::start_run() {
  namespace fs = detail::file_store;
  fs::RunRecord record;
  record.id = fs::random_hex_id();
  record.world_size = options_.world_size;
  record.tag = identity_.tag;
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  record.creator = std::string(host) + " pid " + std::to_string(::getpid());
  const std::string run_path = dir_ + "/r-" + record.id;
  if (::mkdir(run_path.c_str(), 0700) != 0) {
    throw StoreError("FileStore " + describe() + ": cannot create the run folder " + run_path + ": " +
                     fs::describe_errno(errno));
  }
  // The members lock comes first: from then on the folder counts as alive. Nobody else looks
  // at it before we release the folder lock; if we die first, it is dead and gets removed.
  int err = 0;
  run_fd_ = fs::Fd(fs::open_at(AT_FDCWD, run_path.c_str(), O_RDONLY | O_DIRECTORY));
  if (run_fd_) member_fd_ = fs::Fd(fs::open_at(run_fd_.get(), "members", O_RDWR | O_CREAT | O_EXCL, 0600));
  if (!run_fd_ || !member_fd_) err = errno;
  if (err == 0) err = fs::try_lock_byte(member_fd_.get(), 0);
  if (err == 0) {
    fs::Fd marker(fs::open_at(run_fd_.get(), "m-0", O_WRONLY | O_CREAT | O_EXCL, 0600));
    if (!marker) err = errno;
  }
  if (err == 0) {
    const std::string text = fs::format_record(record);
    fs::Fd out(fs::open_at(run_fd_.get(), "record", O_WRONLY | O_CREAT | O_EXCL, 0600));
    if (!out) err = errno;
    if (err == 0) err = fs::write_all(out.get(), reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
    if (err == 0 && ::close(out.release()) != 0) err = errno;
  }
  if (err != 0) {
    member_fd_.reset();
    run_fd_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(run_path, ignored);
    throw StoreError(
        "FileStore " + describe() + ": cannot set up the run folder " + run_path + ": " + fs::describe_errno(err) +
        (err == ENOLCK || err == EOPNOTSUPP ? " (this file system offers no fcntl locks; on NFS run lockd or use NFSv4)"
                                            : ""));
  }
  run_id_ = record.id;
  run_path_ = run_path;
  member_ = 0;
  run_world_size_ = record.world_size;
  key_lock_seed_ = fs::hash64(run_id_, 0);
  log_info(where() + ": started a new run" +
           (identity_.tag.empty() ? "" : " (job identity from " + identity_.source + ")"));
}

/// Removes the folders of runs none of whose members is alive: killed runs, runs whose members
/// all left before it was complete, runs with world_size 0 that ended. Called with the folder
/// lock held exclusively, so nobody joins or leaves a run meanwhile.
inline void FileStore::remove_dead_runs() {
  namespace fs = detail::file_store;
  for (const auto& id : list_runs(".trash-")) {  // removals cut short by a killed process
    std::error_code ignored;
    std::filesystem::remove_all(dir_ + "/.trash-" + id, ignored);
  }
  for (const auto& id : list_runs("r-")) {
    const std::string path = dir_ + "/r-" + id;
    fs::Fd members(fs::open_at(AT_FDCWD, (path + "/members").c_str(), O_RDWR));
    if (members) {
      const int alive = fs::any_lock_held(members.get());
      if (alive != 0) continue;  // alive, or cannot tell (then never remove)
    } else if (errno != ENOENT) {
      continue;
    }
    members.reset();
    std::error_code error;
    std::filesystem::remove_all(path, error);
    if (error) {
      log_warn("FileStore " + describe() + ": could not remove the folder of dead run " + id.substr(0, 8) + ": " +
               error.message() + " (it is never joined; the next run retries)");
    } else {
      log_info("FileStore " + describe() + ": removed dead run " + id.substr(0, 8) + " (no member alive)");
    }
  }
}

// ---- leaving --------------------------------------------------------------------------------

inline FileStore::~FileStore() { leave(); }

/// Marks our slot as left (l-<i>), releases its lock and, when every one of world_size
/// members has left, removes the run's folder. Under the folder lock held shared, so leaving
/// never overlaps the removal of dead runs, and leavers do not wait for each other.
inline void FileStore::leave() noexcept {
  namespace fs = detail::file_store;
  if (run_id_.empty()) return;
  try {
    // Leaving should not hold up a process that is exiting: at most 30 s for the lock.
    const auto limit = std::min<Duration>(options_.timeout, std::chrono::seconds(30));
    auto shared = lock_folder(F_RDLCK, detail::deadline_after(limit), "leave the run");
    const std::string left = "l-" + std::to_string(member_);
    fs::Fd marker(fs::open_at(run_fd_.get(), left.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600));
    if (!marker && errno != EEXIST) {
      log_warn(where() + ": cannot create " + run_path_ + "/" + left + ": " + fs::describe_errno(errno) +
               " (the run's files stay until the next run removes them)");
      member_fd_.reset();
      return;
    }
    marker.reset();
    member_fd_.reset();  // our slot's lock is released: to others we are gone
    if (run_world_size_ <= 0) return;
    // Last to leave when every member's l-<i> exists. One listing of the folder (a few
    // getdents calls) counts them; looking each up would cost O(world_size) per leaver.
    DIR* listing = ::opendir(run_path_.c_str());
    if (listing == nullptr) return;  // gone: removed by another member that left just now
    int left_count = 0;
    while (dirent* entry = ::readdir(listing)) left_count += entry->d_name[0] == 'l' && entry->d_name[1] == '-';
    ::closedir(listing);
    if (left_count < run_world_size_) return;
    // Members that left at the same moment may all see every l-<i>: the one whose rename of
    // the folder out of the way succeeds removes it.
    const std::string trash = dir_ + "/.trash-" + run_id_;
    run_fd_.reset();
    if (::rename(run_path_.c_str(), trash.c_str()) != 0) return;
    std::error_code error;
    std::filesystem::remove_all(trash, error);
    if (error) log_warn(where() + ": could not remove the run's folder " + trash + ": " + error.message());
  } catch (const std::exception& e) {
    log_warn(where() + ": leaving the run failed: " + e.what() + " (the next run in this folder removes what is left)");
  } catch (...) {
    log_warn(where() + ": leaving the run failed (the next run in this folder removes what is left)");
  }
  member_fd_.reset();
}

// ---- what a timeout message adds ------------------------------------------------------------

inline std::string FileStore::other_jobs_note() {
  namespace fs = detail::file_store;
  try {
    const std::string my_tag = fs::escape_key(identity_.tag);
    std::string runs;
    int count = 0;
    for (const auto& id : list_runs()) {
      if (id == run_id_) continue;
      const std::string path = dir_ + "/r-" + id;
      int err = 0;
      auto text = fs::read_text(AT_FDCWD, (path + "/record").c_str(), err);
      auto record = text ? fs::parse_record(*text) : std::nullopt;
      if (!record || record->tag == my_tag) continue;
      fs::Fd members(fs::open_at(AT_FDCWD, (path + "/members").c_str(), O_RDWR));
      if (!members || fs::any_lock_held(members.get()) != 1) continue;
      if (++count > 4) continue;
      const std::string job = record->tag.empty() ? "no job identity" : "job " + fs::unescape_key(record->tag);
      runs += std::string(runs.empty() ? "" : "; ") + "run " + id.substr(0, 8) + " of " + job + " (started by " +
              record->creator + ")";
    }
    if (count == 0) return {};
    if (count > 4) runs += "; and " + std::to_string(count - 4) + " more";
    return " The folder also holds live runs of other jobs, which this store never joins: " + runs + "; " +
           our_identity() +
           ". If those are processes of this job, give every process of the job the same NCCLKIT_RUN_ID; "
           "otherwise give each job its own folder.";
  } catch (const std::exception&) {
    return {};  // the timeout is the error to report
  }
}

}  // namespace ncclkit
