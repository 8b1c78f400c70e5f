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

#include <dirent.h>      // opendir, readdir, closedir
#include <fcntl.h>       // openat, fcntl, F_OFD_SETLK, O_* flags
#include <sys/random.h>  // getrandom
#include <sys/stat.h>    // mkdir, fstat, fstatat
#include <sys/types.h>   // off_t, mode_t
#include <sys/vfs.h>     // fstatfs (is the folder on a local file system?)
#include <unistd.h>      // close, read, write, renameat, unlinkat, getpid, gethostname

#include <algorithm>    // std::min, std::max
#include <atomic>       // std::atomic
#include <cerrno>       // errno
#include <chrono>       // std::chrono
#include <cstdint>      // std::uint64_t, std::int64_t
#include <cstdio>       // std::snprintf
#include <cstring>      // std::strerror, std::memcpy
#include <filesystem>   // std::filesystem::remove_all
#include <fstream>      // std::ifstream (/proc/self/mountinfo)
#include <mutex>        // std::mutex, std::unique_lock
#include <optional>     // std::optional
#include <random>       // std::minstd_rand (lock backoff jitter)
#include <span>         // std::span
#include <sstream>      // std::istringstream (mountinfo lines)
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <thread>       // std::this_thread::sleep_for
#include <unordered_set>  // std::unordered_set (wait's folder listing)
#include <utility>      // std::exchange
#include <vector>       // std::vector

#include "ncclkit/core/deadline.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/time_format.hpp"
#include "ncclkit/store/run_identity.hpp"
#include "ncclkit/store/store.hpp"

#if !defined(F_OFD_SETLK)
#error "ncclkit FileStore needs open file description locks (F_OFD_SETLK: Linux 3.15+, glibc with _GNU_SOURCE)"
#endif

namespace ncclkit {

/// Options of a FileStore.
struct FileStoreOptions {
  /// Number of processes that will use this folder as one run; 0 = unknown. With a known world
  /// size a run is complete once that many processes joined (later arrivals start a new run)
  /// and the last of them to leave removes the run's files; with 0 neither happens (files of a
  /// finished run are removed by the next run that finds its members gone).
  int world_size = 0;
  /// Default timeout of blocking calls, and of taking a lock in the non-blocking ones.
  std::chrono::milliseconds timeout = default_store_timeout();
};

namespace detail::file_store {

using Clock = std::chrono::steady_clock;

/// Polling starts at 100 µs and doubles up to 20 ms: a rendezvous of processes that arrive
/// together completes within a few hundred µs, a long wait costs at most 50 polls a second.
inline constexpr std::chrono::microseconds kPollFirst{100};
inline constexpr std::chrono::microseconds kPollCap{20000};
/// Locks are held for tens of µs, so waiting for one starts polling faster, with jitter so that
/// many waiters do not retry in lock step. The cap bounds the CPU that waiters burn: with W
/// waiters the lock is retried W/cap times a second, so a release is noticed quickly anyway.
inline constexpr std::chrono::microseconds kLockPollFirst{20};
inline constexpr std::chrono::microseconds kLockPollCap{5000};
/// wait() looks up each missing key when at most this many are missing, else lists the folder.
inline constexpr std::size_t kSweepByLookup = 8;
/// A plain key file name ("k-" + escaped key) longer than this becomes "h-" + a 128-bit hash;
/// file systems allow 255 bytes, and temp names add a suffix.
inline constexpr std::size_t kMaxPlainName = 200;
/// Key locks use bytes [1, 1 + kKeyLockSpan) of dir/lock (NLM of NFSv3 handles 63-bit
/// offsets, but staying below 2^31 keeps 32-bit lock managers happy too).
inline constexpr off_t kKeyLockSpan = (off_t{1} << 30);
inline constexpr const char* kRecordMagic = "ncclkit-filestore 1";

/// "No such file or directory (errno 2)".
inline std::string describe_errno(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

using ncclkit::format_seconds;  // "1.234 s", as every store message writes times

/// A key as it appears in messages: quoted, bytes outside printable ASCII as \xNN, long keys cut.
inline std::string quote_key(std::string_view key) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'";
  std::size_t shown = 0;
  for (char raw : key) {
    const auto c = static_cast<unsigned char>(raw);
    if (shown++ == 120) {
      out += "...' (" + std::to_string(key.size()) + " bytes)";
      return out;
    }
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out + "'";
}

/// Owns a file descriptor; closing it releases the open file description locks taken through it.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  /// Gives up ownership (to close it by hand and see close's error).
  int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

/// openat() that retries on EINTR and always sets O_CLOEXEC (an exec'd child must not keep
/// our locks alive). Returns -1 with errno set on failure.
inline int open_at(int dir_fd, const char* path, int flags, mode_t mode = 0) {
  for (;;) {
    int fd = ::openat(dir_fd, path, flags | O_CLOEXEC, mode);
    if (fd >= 0 || errno != EINTR) return fd;
  }
}

/// Writes every byte; 0 or an errno value.
inline int write_all(int fd, const std::uint8_t* data, std::size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return 0;
}

/// Reads a whole file from the start; 0 or an errno value.
inline int read_all(int fd, Bytes& out) {
  struct stat info {};
  if (::fstat(fd, &info) != 0) return errno;
  out.resize(static_cast<std::size_t>(std::max<off_t>(info.st_size, 0)));
  std::size_t used = 0;
  for (;;) {
    ssize_t n;
    if (used < out.size()) {
      n = ::read(fd, out.data() + used, out.size() - used);
    } else {  // the expected size is read; make sure it was the end (files never grow here)
      std::uint8_t extra[4096];
      n = ::read(fd, extra, sizeof extra);
      if (n > 0) out.insert(out.end(), extra, extra + n);
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) break;
    used += static_cast<std::size_t>(n);
  }
  out.resize(used);
  return 0;
}

/// Opens and closes a folder. On NFS, opening a folder revalidates its attributes with the
/// server (close-to-open), so the next lookups in it see names created, replaced or removed
/// by other hosts, whatever the attribute cache timeouts. On a local file system it is a cheap
/// no-op. Returns 0 or an errno value.
inline int refresh_folder(const std::string& path) {
  int fd = open_at(AT_FDCWD, path.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return errno;
  ::close(fd);
  return 0;
}

/// Whether the file is on a local file system (ext2/3/4, xfs, btrfs, tmpfs, overlayfs, f2fs,
/// zfs), whose caches are coherent, so folders need no refresh_folder. Anything else (NFS,
/// CIFS, Lustre, GPFS, CephFS, FUSE, ...) gets the refresh.
inline bool is_local_file_system(int fd) {
  struct statfs info {};
  if (::fstatfs(fd, &info) != 0) return false;
  switch (static_cast<unsigned long>(info.f_type)) {
    case 0xEF53UL:      // ext2/3/4
    case 0x58465342UL:  // xfs
    case 0x9123683EUL:  // btrfs
    case 0x01021994UL:  // tmpfs
    case 0x794C7630UL:  // overlayfs
    case 0xF2F52010UL:  // f2fs
    case 0x2FC12FC1UL:  // zfs
      return true;
    default:
      return false;
  }
}

/// Tests set this to exercise the refreshes that network file systems get, on a local disk.
inline std::atomic<bool>& always_refresh_folders() {
  static std::atomic<bool> value{false};
  return value;
}

/// Escapes a key into file-name characters: [a-z0-9._-] stay, every other byte becomes %xx.
/// Upper-case letters are escaped too, so that keys stay distinct on case-insensitive file
/// systems. Injective, and '/' or NUL never reach the file system.
inline std::string escape_key(std::string_view key) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(key.size());
  for (char raw : key) {
    const auto c = static_cast<unsigned char>(raw);
    if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

/// The inverse of escape_key, for showing an escaped name (a run's tag) in messages.
inline std::string unescape_key(std::string_view escaped) {
  auto digit = [](char c) { return c >= 'a' ? c - 'a' + 10 : c - '0'; };
  std::string out;
  for (std::size_t i = 0; i < escaped.size(); ++i) {
    if (escaped[i] == '%' && i + 2 < escaped.size()) {
      out.push_back(static_cast<char>(digit(escaped[i + 1]) * 16 + digit(escaped[i + 2])));
      i += 2;
    } else {
      out.push_back(escaped[i]);
    }
  }
  return out;
}

/// A 64-bit bijective mixer (the splitmix64 finaliser).
inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

/// A seeded 64-bit hash of bytes. Not cryptographic: file names of long keys carry two of
/// these (128 bits) and the file repeats the key, so a collision is detected, never silent.
inline std::uint64_t hash64(std::string_view data, std::uint64_t seed) {
  std::uint64_t h = mix64(seed ^ (data.size() * 0x9e3779b97f4a7c15ULL));
  for (std::size_t i = 0; i < data.size(); i += 8) {
    std::uint64_t block = 0;
    std::memcpy(&block, data.data() + i, std::min<std::size_t>(8, data.size() - i));
    h = mix64(h ^ block) + 0x9e3779b97f4a7c15ULL;
  }
  return mix64(h);
}

inline std::string hex64(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

/// The file that holds `key`: "k-<escaped>" or, when that would be too long, "h-<128-bit hash>".
inline std::string key_file_name(std::string_view key) {
  std::string name = "k-" + escape_key(key);
  if (name.size() <= kMaxPlainName) return name;
  return "h-" + hex64(hash64(key, 0x6e63636c6b697431ULL)) + hex64(hash64(key, 0x66696c6573746f72ULL));
}

inline bool is_key_file_name(const char* name) {
  return (name[0] == 'k' || name[0] == 'h') && name[1] == '-';
}

/// Long keys' files start with "ncclkit-key <length>\n<key>" so that a read can verify it.
inline std::string hashed_key_header(std::string_view key) {
  return "ncclkit-key " + std::to_string(key.size()) + "\n" + std::string(key);
}

/// 32 random hex digits from the kernel's generator.
inline std::string random_hex_id() {
  std::uint64_t words[2] = {0, 0};
  std::size_t got = 0;
  auto* bytes = reinterpret_cast<std::uint8_t*>(words);
  while (got < sizeof words) {
    ssize_t n = ::getrandom(bytes + got, sizeof words - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      // Never expected on Linux >= 3.17; fall back to time, pid and address entropy.
      words[0] ^= mix64(static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()));
      words[1] ^= mix64(static_cast<std::uint64_t>(::getpid()) ^ reinterpret_cast<std::uintptr_t>(&got));
      break;
    }
    got += static_cast<std::size_t>(n);
  }
  return hex64(words[0]) + hex64(words[1]);
}

/// Sleeps with exponential backoff, never past a deadline.
class Backoff {
 public:
  Backoff(std::chrono::microseconds first, std::chrono::microseconds cap, bool jitter)
      : first_(first), next_(first), cap_(cap), jitter_(jitter) {}

  void sleep(Clock::time_point deadline) {
    const auto now = Clock::now();
    if (now >= deadline) return;
    auto interval = std::chrono::duration_cast<Clock::duration>(next_);
    if (jitter_) {
      thread_local std::minstd_rand random(static_cast<unsigned>(::getpid()) ^
                                           static_cast<unsigned>(now.time_since_epoch().count()));
      interval = interval / 2 + interval * static_cast<long>(random() % 1024) / 1024;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(interval, deadline - now));
    next_ = std::min(next_ * 2, cap_);
  }
  void reset() { next_ = first_; }

 private:
  std::chrono::microseconds first_, next_, cap_;
  bool jitter_;
};

/// Tries an open file description lock on one byte (F_WRLCK: exclusive, F_RDLCK: shared);
/// 0, EAGAIN/EACCES when a conflicting lock is held, or another errno value (ENOLCK: the file
/// system offers no locks).
inline int try_lock_byte(int fd, off_t offset, short type = F_WRLCK) {
  struct flock lock {};
  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  lock.l_start = offset;
  lock.l_len = 1;
  for (;;) {
    if (::fcntl(fd, F_OFD_SETLK, &lock) == 0) return 0;
    if (errno != EINTR) return errno;
  }
}

inline void unlock_byte(int fd, off_t offset) noexcept {
  struct flock lock {};
  lock.l_type = F_UNLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = offset;
  lock.l_len = 1;
  while (::fcntl(fd, F_OFD_SETLK, &lock) != 0 && errno == EINTR) {
  }
}

/// Polls for the lock until `deadline` (F_OFD_SETLKW has no timeout); 0, ETIMEDOUT or errno.
inline int lock_byte_until(int fd, off_t offset, Clock::time_point deadline, short type = F_WRLCK) {
  Backoff backoff(kLockPollFirst, kLockPollCap, true);
  for (;;) {
    int err = try_lock_byte(fd, offset, type);
    if (err == 0) return 0;
    if (err != EAGAIN && err != EACCES) return err;
    if (Clock::now() >= deadline) return ETIMEDOUT;
    backoff.sleep(deadline);
  }
}

/// Releases a byte lock taken with lock_byte_until when it goes out of scope.
class ByteLock {
 public:
  ByteLock(int fd, off_t offset) : fd_(fd), offset_(offset) {}
  ByteLock(ByteLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)), offset_(other.offset_) {}
  ByteLock(const ByteLock&) = delete;
  ByteLock& operator=(const ByteLock&) = delete;
  ByteLock& operator=(ByteLock&&) = delete;
  ~ByteLock() {
    if (fd_ >= 0) unlock_byte(fd_, offset_);
  }

 private:
  int fd_;
  off_t offset_;
};

/// Whether any open file description holds a lock anywhere in the file: how a run tells that
/// one of its members still lives. 1, 0, or -errno.
inline int any_lock_held(int fd) {
  struct flock probe {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  probe.l_start = 0;
  probe.l_len = 0;  // to the end of every possible file
  for (;;) {
    if (::fcntl(fd, F_OFD_GETLK, &probe) == 0) return probe.l_type == F_UNLCK ? 0 : 1;
    if (errno != EINTR) return -errno;
  }
}

/// Writes a small text file atomically: a temp file in the same folder, then rename.
inline int write_text_atomically(int dir_fd, const std::string& name, const std::string& text) {
  const std::string temp = ".t-" + std::to_string(::getpid()) + "-" + random_hex_id().substr(0, 12);
  Fd fd(open_at(dir_fd, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600));
  if (!fd) return errno;
  int err = write_all(fd.get(), reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
  fd.reset();
  if (err == 0 && ::renameat(dir_fd, temp.c_str(), dir_fd, name.c_str()) != 0) err = errno;
  if (err != 0) ::unlinkat(dir_fd, temp.c_str(), 0);
  return err;
}

/// A whole small file as text; nullopt when it does not exist. Other errors set `err`.
inline std::optional<std::string> read_text(int dir_fd, const char* name, int& err) {
  err = 0;
  Fd fd(open_at(dir_fd, name, O_RDONLY));
  if (!fd) {
    if (errno != ENOENT) err = errno;
    return std::nullopt;
  }
  Bytes bytes;
  if ((err = read_all(fd.get(), bytes)) != 0) return std::nullopt;
  return std::string(bytes.begin(), bytes.end());
}

/// Creates `path` and missing parents with mode 0700 (existing folders keep their mode).
/// 0 or an errno value.
inline int make_folders(const std::string& path) {
  for (std::size_t i = 1; i <= path.size(); ++i) {
    if (i != path.size() && path[i] != '/') continue;
    const std::string prefix = path.substr(0, i);
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) return errno;
  }
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return errno;
  return S_ISDIR(info.st_mode) ? 0 : ENOTDIR;
}

/// The mount that holds `path` (from /proc/self/mountinfo): file-system type and options.
struct MountInfo {
  std::string mount_point, fs_type, options;
};

inline std::string unescape_mountinfo(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 3 < text.size()) {  // octal escapes such as \040 for a space
      out.push_back(static_cast<char>((text[i + 1] - '0') * 64 + (text[i + 2] - '0') * 8 + (text[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

inline std::optional<MountInfo> find_mount(const std::string& path) {
  std::error_code ignored;
  const std::string real = std::filesystem::canonical(path, ignored).string();
  if (real.empty()) return std::nullopt;
  std::ifstream input("/proc/self/mountinfo");
  std::optional<MountInfo> best;
  std::string line;
  while (std::getline(input, line)) {
    std::istringstream fields(line);
    std::string id, parent, device, root, mount_point, mount_options, field;
    fields >> id >> parent >> device >> root >> mount_point >> mount_options;
    while (fields >> field && field != "-") {
    }
    MountInfo info;
    std::string source, super_options;
    fields >> info.fs_type >> source >> super_options;
    info.mount_point = unescape_mountinfo(mount_point);
    info.options = mount_options + "," + super_options;
    const auto& mp = info.mount_point;
    const bool contains = mp == "/" || real == mp || (real.rfind(mp, 0) == 0 && real[mp.size()] == '/');
    if (contains && (!best || mp.size() >= best->mount_point.size())) best = info;
  }
  return best;
}

inline bool has_option(const std::string& options, std::string_view option) {
  std::size_t start = 0;
  while (start <= options.size()) {
    std::size_t end = options.find(',', start);
    if (end == std::string::npos) end = options.size();
    if (std::string_view(options).substr(start, end - start) == option) return true;
    start = end + 1;
  }
  return false;
}

/// Warnings for mounts on which FileStore's guarantees do not hold across hosts.
inline std::string mount_warning(const std::string& path) {
  auto mount = find_mount(path);
  if (!mount) return {};
  const std::string where = "'" + path + "' is on " + mount->fs_type + " mount " + mount->mount_point;
  if (mount->fs_type.rfind("nfs", 0) == 0) {
    if (has_option(mount->options, "nolock") || has_option(mount->options, "local_lock=posix") ||
        has_option(mount->options, "local_lock=all")) {
      return where + " with local locks (nolock or local_lock=posix/all): add, compare_set and run "
             "membership are only atomic among processes of this host; remount without them "
             "(NFSv4, or NFSv3 with lockd) for several hosts";
    }
    if (has_option(mount->options, "nocto")) {
      return where + " with nocto: other hosts' keys may be seen late or stale; remount without nocto";
    }
  }
  if (mount->fs_type == "lustre" && has_option(mount->options, "localflock")) {
    return where + " with localflock: locks are local to this host; mount with -o flock for several hosts";
  }
  return {};
}

/// Whether a folder entry is a run's folder: "r-" and 32 hex digits. Nothing else in the
/// rendezvous folder is ever touched.
inline bool is_run_folder_name(std::string_view name) {
  return name.size() == 34 && name.substr(0, 2) == "r-" &&
         name.find_first_not_of("0123456789abcdef", 2) == std::string_view::npos;
}

/// A run's record, dir/r-<id>/record: written once when the run starts.
struct RunRecord {
  std::string id;
  int world_size = 0;
  std::string tag;
  std::string creator;
};

inline std::string format_record(const RunRecord& record) {
  return std::string(kRecordMagic) + "\nrun " + record.id + "\nworld_size " + std::to_string(record.world_size) +
         "\ntag " + escape_key(record.tag) + "\ncreator " + record.creator + "\n";
}

/// Parses a run record; nullopt when it is not one this version wrote.
inline std::optional<RunRecord> parse_record(const std::string& text) {
  std::istringstream lines(text);
  std::string line;
  if (!std::getline(lines, line) || line != kRecordMagic) return std::nullopt;
  RunRecord record;
  bool have_world = false;
  while (std::getline(lines, line)) {
    const auto space = line.find(' ');
    const std::string field = line.substr(0, space);
    const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
    if (field == "run") {
      record.id = value;
    } else if (field == "world_size") {
      auto parsed = parse_int(value);
      if (!parsed || *parsed < 0 || *parsed > (1 << 30)) return std::nullopt;
      record.world_size = static_cast<int>(*parsed);
      have_world = true;
    } else if (field == "tag") {
      record.tag = value;  // kept escaped: only compared
    } else if (field == "creator") {
      record.creator = value;
    }
  }
  if (record.id.size() != 32 || record.id.find_first_not_of("0123456789abcdef") != std::string::npos || !have_world)
    return std::nullopt;
  return record;
}

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
  RunIdentity identity_;  ///< a run is joined only by processes with the same tag
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

// ---- construction: joining a run -------------------------------------------------------------

inline FileStore::FileStore(std::string dir, FileStoreOptions options)
    : dir_(std::move(dir)), options_(options) {
  namespace fs = detail::file_store;
  if (dir_.empty()) throw ConfigError("FileStore: the rendezvous folder path is empty; pass a folder such as /tmp/job-42");
  if (options_.world_size < 0) {
    throw ConfigError("FileStore " + describe() + ": world_size=" + std::to_string(options_.world_size) +
                      " must be >= 0 (0 = unknown)");
  }
  if (options_.timeout.count() < 0) {
    throw ConfigError("FileStore " + describe() + ": the timeout must not be negative");
  }
  set_default_timeout(options_.timeout);
  identity_ = run_identity_from_environment();

  if (int err = fs::make_folders(dir_); err != 0) {
    if (struct stat info {}; err == ENOTDIR && ::stat(dir_.c_str(), &info) == 0 && S_ISREG(info.st_mode)) {
      throw ConfigError("FileStore " + describe() + ": " + dir_ + " is a regular file, but a FileStore (and a " +
                        "file:// init URL) names a folder, in which it keeps one file per key (unlike PyTorch's " +
                        "FileStore, whose file:// names a file); give a folder path, e.g. file://" + dir_ + ".d");
    }
    throw StoreError("FileStore " + describe() + ": cannot create or use the rendezvous folder: " +
                     fs::describe_errno(err) + "; choose a folder this user can write");
  }
  lock_fd_ = fs::Fd(fs::open_at(AT_FDCWD, (dir_ + "/lock").c_str(), O_RDWR | O_CREAT, 0600));
  if (!lock_fd_) {
    throw StoreError("FileStore " + describe() + ": cannot open its lock file " + dir_ + "/lock: " +
                     fs::describe_errno(errno));
  }
  if (auto warning = fs::mount_warning(dir_); !warning.empty()) log_warn("FileStore: " + warning);
  refresh_ = fs::always_refresh_folders().load() || !fs::is_local_file_system(lock_fd_.get());
  join();
}

inline detail::file_store::ByteLock FileStore::lock_folder(short type, Clock::time_point deadline, const char* purpose) {
  namespace fs = detail::file_store;
  const auto start = Clock::now();
  int err = fs::lock_byte_until(lock_fd_.get(), 0, deadline, type);
  if (err == ETIMEDOUT) {
    throw TimeoutError("FileStore " + describe() + ": could not take the folder lock (" + dir_ + "/lock, byte 0) to " +
                       purpose + " within " + fs::format_seconds(Clock::now() - start) +
                       "; a process holding it may be stopped, or the file server unreachable");
  }
  if (err != 0) {
    throw StoreError("FileStore " + describe() + ": cannot lock " + dir_ + "/lock to " + purpose + ": " +
                     fs::describe_errno(err) +
                     (err == ENOLCK || err == EOPNOTSUPP ? " (this file system offers no fcntl locks; on NFS run lockd or use NFSv4)" : ""));
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
    if (name.substr(0, prefix.size()) == prefix && fs::is_run_folder_name("r-" + std::string(name.substr(prefix.size()))))
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
    throw ConfigError("FileStore " + describe() + ": the folder's " + mismatch + ", but this process was given world_size " +
                      std::to_string(options_.world_size) +
                      "; all processes of a job must pass the same world size, and two jobs must not share a folder "
                      "at once (" + our_identity() + "; use another folder, or give each job its own NCCLKIT_RUN_ID)");
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
      throw StoreError("FileStore " + describe() + ": cannot test the locks of " + path + "/members: " +
                       fs::describe_errno(-alive) +
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
      throw StoreError("FileStore " + describe() + ": cannot lock " + run_path + "/members: " + fs::describe_errno(err));
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
    throw StoreError("FileStore " + describe() + ": cannot create the run folder " + run_path + ": " + fs::describe_errno(errno));
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
    throw StoreError("FileStore " + describe() + ": cannot set up the run folder " + run_path + ": " + fs::describe_errno(err) +
                     (err == ENOLCK || err == EOPNOTSUPP ? " (this file system offers no fcntl locks; on NFS run lockd or use NFSv4)" : ""));
  }
  run_id_ = record.id;
  run_path_ = run_path;
  member_ = 0;
  run_world_size_ = record.world_size;
  key_lock_seed_ = fs::hash64(run_id_, 0);
  log_info(where() + ": started a new run" + (identity_.tag.empty() ? "" : " (job identity from " + identity_.source + ")"));
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
  const off_t offset = 1 + static_cast<off_t>(fs::hash64(key, key_lock_seed_) % static_cast<std::uint64_t>(fs::kKeyLockSpan));
  const auto start = Clock::now();
  const auto deadline = detail::deadline_after(default_timeout(), start);
  int err = fs::lock_byte_until(lock_fd_.get(), offset, deadline);
  if (err == ETIMEDOUT) {
    throw TimeoutError(where() + ": " + op + " of key " + fs::quote_key(key) + " could not take the key's lock within " +
                       fs::format_seconds(Clock::now() - start) +
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
  if (int err = fs::read_all(fd.get(), value); err != 0) fail("read", key, "cannot read " + run_path_ + "/" + name, err);
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
  const std::string temp = ".t-" + temp_token_ + "-" + std::to_string(::getpid()) + "-" +
                           std::to_string(temp_counter_.fetch_add(1));
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
    fail("write", key, "cannot write " + std::to_string(value.size()) + " bytes to " + run_path_ + "/" + temp +
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
  fs::Backoff backoff(fs::kPollFirst, fs::kPollCap, false);
  for (;;) {
    refresh_run_folder();
    if (auto value = read_key(name, key)) return std::move(*value);
    if (Clock::now() >= deadline) break;
    backoff.sleep(deadline);
  }
  throw TimeoutError(where() + ": get of key " + fs::quote_key(key) + " timed out after " +
                     fs::format_seconds(Clock::now() - start) + " (timeout " + fs::format_seconds(timeout) +
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
  fs::Backoff backoff(fs::kPollFirst, fs::kPollCap, false);
  for (;;) {
    refresh_run_folder();
    bool front_present = true;
    if (struct stat info {}; !missing.empty() && ::fstatat(run_fd_.get(), missing.front().c_str(), &info, 0) != 0) {
      if (errno != ENOENT) {
        throw StoreError(where() + ": wait cannot look up " + run_path_ + "/" + missing.front() + ": " +
                         fs::describe_errno(errno));
      }
      front_present = false;
    }
    if (front_present) sweep(missing);
    if (missing.empty()) return;
    if (Clock::now() >= deadline) break;
    backoff.sleep(deadline);
  }
  sweep(missing);  // name every key still missing, not just the first
  std::string names;
  std::size_t shown = 0;
  for (const auto& key : keys) {
    if (std::find(missing.begin(), missing.end(), fs::key_file_name(key)) == missing.end()) continue;
    if (shown++ < 32) names += (names.empty() ? "" : ", ") + fs::quote_key(key);
  }
  if (missing.size() > 32) names += ", ... (" + std::to_string(missing.size()) + " in all)";
  throw TimeoutError(where() + ": wait for " + std::to_string(keys.size()) + " key(s) timed out after " +
                     fs::format_seconds(Clock::now() - start) + " (timeout " + fs::format_seconds(timeout) + "); " +
                     std::to_string(missing.size()) + " still missing: " + names +
                     ". Are the processes that set them running, and using " + dir_ + "?" + other_jobs_note());
}

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
  const std::string temp =
      write_temp(key, name, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
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
    throw StoreError(where() + ": num_keys cannot list " + run_path_ + ": " + detail::file_store::describe_errno(errno));
  }
  std::int64_t count = 0;
  while (dirent* entry = ::readdir(listing)) {
    if (detail::file_store::is_key_file_name(entry->d_name)) ++count;
  }
  ::closedir(listing);
  return count;
}

}  // namespace ncclkit
