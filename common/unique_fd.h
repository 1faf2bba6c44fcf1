// The owner of one file descriptor: it is closed exactly once, when its UniqueFd goes
// away or is reset, on every path, error paths and exceptions included. Move-only.
//
// close(2) is never retried: Linux releases the descriptor even when close fails (EINTR
// included), so a retry could close a descriptor another thread has just been given.
// Closing leaves errno as it was, so `const int err = errno;` after a cleanup still reads
// the failure that mattered. close() reports close's own error for the few callers that
// must (a file whose data is only durable once close succeeds).
#pragma once

#include <unistd.h>

#include <cerrno>
#include <utility>

namespace ddprun {

class UniqueFd {
 public:
  UniqueFd() = default;
  // Takes ownership of `fd`; a negative value (a failed open, socket, ...) owns nothing.
  explicit UniqueFd(int fd) noexcept : fd_(fd < 0 ? -1 : fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  // The descriptor, still owned; -1 when none is held.
  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  explicit operator bool() const noexcept { return valid(); }

  // Gives up ownership without closing; returns the descriptor (-1 when none was held).
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }

  // Closes the descriptor held (if any, and unless it is `fd` itself), then owns `fd`.
  // errno is preserved.
  void reset(int fd = -1) noexcept {
    const int old = std::exchange(fd_, fd < 0 ? -1 : fd);
    if (old >= 0 && old != fd_) {
      const int saved = errno;
      ::close(old);
      errno = saved;
    }
  }

  // Closes now and returns 0, or close(2)'s errno (EIO, ENOSPC, EDQUOT: data written
  // earlier may not have reached the file). The descriptor is gone either way; 0 when
  // none was held.
  [[nodiscard]] int close() noexcept {
    const int old = release();
    if (old < 0) return 0;
    return ::close(old) == 0 ? 0 : errno;
  }

 private:
  int fd_ = -1;
};

}  // namespace ddprun
