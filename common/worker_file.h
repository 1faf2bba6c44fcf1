// Reading a file whose path a worker controls: anything in the run directory the worker
// writes into (its error file, py_exception.<pid>, py_stacks.<pid>), the TORCHELASTIC_ERROR_FILE
// it was given, torch's flight recorder dumps, the source files its tracebacks name. A
// worker that fails (or one that means harm) can leave there a FIFO, which a plain open()
// or read() waits on for ever, a device that never ends (/dev/zero), a symbolic link to
// either, or a file of gigabytes. These functions open such a path with
// O_RDONLY|O_NONBLOCK|O_NOFOLLOW|O_CLOEXEC (the open never waits), accept only a regular
// file (checked on the descriptor, so a rename between a check and the open changes
// nothing), and read at most a bound. Nothing here blocks on another process or throws.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <cstddef>
#include <string>

#include "common/unique_fd.h"

namespace ddprun {

// What readWorkerFile() found.
struct WorkerFile {
  std::string bytes;  // the file's first bytes, at most the bound asked for
  bool cut = false;   // the file held more than the bound: `bytes` is its beginning only
  // 0 when the file was read; else why not: ENOENT (no file), ELOOP (a symbolic link),
  // EINVAL (not a regular file: a FIFO, a device, a directory, a socket), or the errno of
  // open, fstat or read.
  int error = 0;
  // "" when the file was read; else one line naming the path and the reason, e.g.
  // "/run/attempt_0/0/error.json: a FIFO, not a regular file; not read".
  std::string problem;

  bool ok() const { return error == 0; }
  bool missing() const { return error == ENOENT; }
};

// Whether a symbolic link as the path's last component is refused (the files a worker
// writes: nothing of ddprun's is ever a link there) or followed to a regular file (the
// source files a traceback names, which installs and build tools often link).
enum class WorkerFileLinks { kRefuse, kFollow };

// Opens `path` for reading as described above and returns the descriptor of a regular
// file, with its fstat in `st`. An invalid descriptor otherwise, with `problem` set as in
// WorkerFile::problem and `error` (both optional) as in WorkerFile::error. Never blocks on
// another process; never throws.
UniqueFd openWorkerFile(const std::string& path, struct stat& st, std::string* problem = nullptr, int* error = nullptr,
                        WorkerFileLinks links = WorkerFileLinks::kRefuse);

// Reads at most `max_bytes` from `fd`, a descriptor openWorkerFile() returned for `path`
// (named in a problem only), whose fstat is `st`; for a caller that looks at the file (its
// size, say) before it reads. Never blocks on another process; never throws except
// std::bad_alloc.
WorkerFile readWorkerFd(int fd, const struct stat& st, const std::string& path, size_t max_bytes);

// Reads at most `max_bytes` of the regular file at `path` (see WorkerFile). A file that grows
// while it is read is read up to the bound; `cut` says whether there was more. Never blocks
// on another process; never throws except std::bad_alloc.
WorkerFile readWorkerFile(const std::string& path, size_t max_bytes, WorkerFileLinks links = WorkerFileLinks::kRefuse);

// Creates or opens for writing a file of ddprun's own in a directory a worker can write into
// (its log directory: stdout.log, stacks.txt): with O_WRONLY|O_CREAT|O_NOFOLLOW|O_NONBLOCK|
// O_CLOEXEC and `flags` (O_TRUNC, O_APPEND, O_EXCL), so that a FIFO left there, which a plain
// open waits on until a reader comes, or a link to elsewhere, is refused; only a regular file
// is kept (checked on the descriptor), and O_NONBLOCK is then cleared. An invalid descriptor
// otherwise, with `reason` (optional) saying why without the path: "a FIFO, not a regular
// file", "a symbolic link, not followed", or strerror. Never blocks on another process.
UniqueFd createWorkerFile(const std::string& path, int flags, mode_t mode, std::string* reason = nullptr);

}  // namespace ddprun
