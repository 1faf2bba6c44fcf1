#include "common/worker_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "common/text_escape.h"

namespace ddprun {
namespace {

const char* kindOf(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

UniqueFd openWorkerFile(const std::string& path, struct stat& st, std::string* problem, int* error,
                        WorkerFileLinks links) {
  auto fail = [&](int err, const std::string& why) {
    if (problem) *problem = fmt::format("{}: {}; not read", printable(path), why);
    if (error) *error = err;
    return UniqueFd();
  };
  // O_NONBLOCK: opening a FIFO for reading waits for a writer without it. O_NOFOLLOW: a
  // link to /dev/zero or to a FIFO elsewhere is refused as a link, before its target is opened.
  const int follow = links == WorkerFileLinks::kRefuse ? O_NOFOLLOW : 0;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | follow | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    return fail(err, err == ELOOP ? std::string("a symbolic link, not followed") : std::strerror(err));
  }
  if (::fstat(fd.get(), &st) != 0) {
    const int err = errno;
    return fail(err, std::string("fstat: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) return fail(EINVAL, std::string(kindOf(st.st_mode)) + ", not a regular file");
  if (problem) problem->clear();
  if (error) *error = 0;
  return fd;
}

WorkerFile readWorkerFile(const std::string& path, size_t max_bytes, WorkerFileLinks links) {
  WorkerFile file;
  struct stat st {};
  const UniqueFd fd = openWorkerFile(path, st, &file.problem, &file.error, links);
  if (!fd) return file;
  return readWorkerFd(fd.get(), st, path, max_bytes);
}

WorkerFile readWorkerFd(int fd, const struct stat& st, const std::string& path, size_t max_bytes) {
  WorkerFile file;
  // The size is a hint for the buffer only: the file may grow or shrink while it is read.
  file.bytes.resize(std::min(max_bytes, static_cast<size_t>(std::max<off_t>(st.st_size, 0))));
  size_t got = 0;
  for (;;) {
    if (got == file.bytes.size()) {
      if (got >= max_bytes) break;
      file.bytes.resize(std::min(max_bytes, std::max<size_t>(got * 2, 4096)));
    }
    const ssize_t n = ::read(fd, file.bytes.data() + got, file.bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      file.bytes.clear();
      file.error = err;
      file.problem = fmt::format("{}: read: {}; not read", printable(path), std::strerror(err));
      return file;
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  file.bytes.resize(got);
  if (got == max_bytes) {
    // One byte more says whether the bound cut the file.
    char extra = 0;
    ssize_t n;
    do {
      n = ::read(fd, &extra, 1);
    } while (n < 0 && errno == EINTR);
    file.cut = n > 0;
  }
  return file;
}

UniqueFd createWorkerFile(const std::string& path, int flags, mode_t mode, std::string* reason) {
  auto fail = [&](const std::string& why) {
    if (reason) *reason = why;
    return UniqueFd();
  };
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | flags, mode));
  if (!fd) {
    const int err = errno;
    if (err == ELOOP) return fail("a symbolic link, not followed");
    // ENXIO: a FIFO without a reader (or a device without its driver) is there.
    struct stat st {};
    if (err == ENXIO && ::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      return fail(std::string(kindOf(st.st_mode)) + ", not a regular file");
    }
    return fail(std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return fail(std::string("fstat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail(std::string(kindOf(st.st_mode)) + ", not a regular file");
  const int status = ::fcntl(fd.get(), F_GETFL);
  if (status < 0 || ::fcntl(fd.get(), F_SETFL, status & ~O_NONBLOCK) != 0) {
    return fail(std::string("fcntl: ") + std::strerror(errno));
  }
  if (reason) reason->clear();
  return fd;
}

}  // namespace ddprun
