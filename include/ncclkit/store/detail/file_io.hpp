#pragma once
/// FileStore's file input and output: an owned descriptor, whole reads and writes that retry
/// on EINTR, folders made and refreshed (the close-to-open revalidation that NFS needs), and
/// whether a file system is local. Every function returns an errno value, never throws: the
/// store turns errors into messages that say which file and what to do.

#include <fcntl.h>      // openat, O_* flags
#include <sys/stat.h>   // mkdir, fstat, stat
#include <sys/types.h>  // off_t, mode_t
#include <sys/vfs.h>    // fstatfs (is the folder on a local file system?)
#include <unistd.h>     // close, read, write

#include <algorithm>  // std::max
#include <atomic>     // std::atomic
#include <cerrno>     // errno
#include <cstdint>    // std::uint8_t
#include <cstring>    // std::strerror
#include <optional>   // std::optional
#include <string>     // std::string
#include <utility>    // std::exchange

#include "ncclkit/store/store.hpp"  // Bytes

namespace ncclkit::detail::file_store {

/// "No such file or directory (errno 2)".
inline std::string describe_errno(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
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

}  // namespace ncclkit::detail::file_store
