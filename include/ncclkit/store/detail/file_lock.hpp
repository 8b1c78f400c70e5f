#pragma once
/// Byte locks of the FileStore: open file description locks (F_OFD_SETLK) on single bytes of
/// a file, shared or exclusive, taken with a deadline (polled: F_OFD_SETLKW has no timeout) and
/// released by RAII; and the probe that tells whether anyone holds a lock in a file, which is
/// how a run sees that a member lives. They work across hosts on NFS with lockd or NFSv4.

#include <fcntl.h>      // fcntl, F_OFD_SETLK, F_OFD_GETLK, struct flock
#include <sys/types.h>  // off_t

#include <cerrno>   // errno, EAGAIN, EACCES, ETIMEDOUT
#include <chrono>   // std::chrono
#include <utility>  // std::exchange

#include "ncclkit/core/detail/poll.hpp"  // poll_until, BackoffPolicy

#if !defined(F_OFD_SETLK)
#error "ncclkit FileStore needs open file description locks (F_OFD_SETLK: Linux 3.15+, glibc with _GNU_SOURCE)"
#endif

namespace ncclkit::detail::file_store {

/// Locks are held for tens of µs, so waiting for one starts polling fast (20 µs), with jitter
/// so that many waiters do not retry in lock step. The cap (5 ms) bounds the CPU that waiters
/// burn: with W waiters the lock is retried W/cap times a second, so a release is noticed
/// quickly anyway.
inline constexpr BackoffPolicy kLockPoll{
    .first = std::chrono::microseconds(20), .cap = std::chrono::microseconds(5000), .jitter = true};

/// Key locks use bytes [1, 1 + kKeyLockSpan) of dir/lock (NLM of NFSv3 handles 63-bit
/// offsets, but staying below 2^31 keeps 32-bit lock managers happy too).
inline constexpr off_t kKeyLockSpan = (off_t{1} << 30);

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
inline int lock_byte_until(int fd, off_t offset, std::chrono::steady_clock::time_point deadline, short type = F_WRLCK) {
  int err = 0;
  const bool settled = poll_until(deadline, kLockPoll, [&] {
    err = try_lock_byte(fd, offset, type);
    return err != EAGAIN && err != EACCES;  // taken, or an error that waiting does not cure
  });
  return settled ? err : ETIMEDOUT;
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

}  // namespace ncclkit::detail::file_store
