#include "agent/output/log_layout.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "common/env_names.h"
#include "common/error.h"
#include "common/text_escape.h"

namespace ddprun::agent {
namespace fs = std::filesystem;
namespace {

// A child directory of `parent_fd` named `name` (made when missing), opened; never a link.
// ddprun's own directories in the run directory: a worker that put a link there would send
// the agent's files elsewhere.
UniqueFd makeSubdirectory(int parent_fd, const std::string& name, const std::string& path) {
  if (::mkdirat(parent_fd, name.c_str(), 0755) != 0 && errno != EEXIST) throw SystemError("mkdir " + path, errno);
  UniqueFd fd(::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) throw SystemError("open " + path, errno);
  return fd;
}

std::string ownerName(uid_t uid) {
  std::vector<char> buffer(16384);
  struct passwd pw {};
  struct passwd* found = nullptr;
  if (::getpwuid_r(uid, &pw, buffer.data(), buffer.size(), &found) == 0 && found != nullptr) {
    return fmt::format("{} (uid {})", found->pw_name, uid);
  }
  return fmt::format("uid {}", uid);
}

// Six letters or digits from the system's randomness, as mkdtemp picks them.
std::string randomSuffix() {
  static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device random;
  std::string suffix;
  for (int i = 0; i < 6; ++i) suffix += kChars[random() % (sizeof kChars - 1)];
  return suffix;
}

}  // namespace

std::string unsafeDirectoryReason(const struct stat& st) {
  if (!S_ISDIR(st.st_mode)) return "not a directory";
  const uid_t me = ::geteuid();
  if (st.st_uid != me && st.st_uid != 0) {
    return fmt::format(
        "owned by {}, who could replace the run directory ddprun makes in it; use a directory of your own",
        ownerName(st.st_uid));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return fmt::format(
        "writable by {} without the sticky bit (mode {:04o}), so another user could replace the run directory ddprun "
        "makes in it; use a directory of your own, or chmod +t it",
        (st.st_mode & S_IWOTH) != 0 ? "others" : "its group", st.st_mode & 07777);
  }
  return {};
}

namespace {

// `dir` opened, once unsafeDirectoryReason found nothing against it. Throws UsageError
// naming `what` (the flag or variable that named it) and the path.
UniqueFd openSafeParent(const std::string& dir, const std::string& what) {
  // The directory itself, as named (a link to it is the user's own choice); then every
  // check on the descriptor, so that what is checked is what the run directory goes into.
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd)
    throw UsageError(fmt::format("{} {}: cannot open directory: {}", what, printable(dir), std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw SystemError("fstat " + dir, errno);
  if (std::string reason = unsafeDirectoryReason(st); !reason.empty()) {
    throw UsageError(fmt::format("{} {}: unsafe for a run directory: {}", what, printable(dir), reason));
  }
  return fd;
}

}  // namespace

void ensureWritableDirectory(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UsageError("--log_dir " + dir + ": cannot create directory: " + ec.message());
  if (!fs::is_directory(dir, ec)) throw UsageError("--log_dir " + dir + ": not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw UsageError("--log_dir " + dir + ": not writable: " + std::strerror(errno));
  }
  openSafeParent(dir, "--log_dir");
}

LogLayout::LogLayout(const std::optional<std::string>& log_dir, const std::string& run_id, bool keep_temporary) {
  std::string parent;
  if (log_dir) {
    ensureWritableDirectory(*log_dir);
    parent = *log_dir;
  } else {
    const char* tmp = std::getenv(env::kTmpDir);
    parent = tmp && *tmp ? tmp : "/tmp";
    remove_on_exit_ = !keep_temporary;
  }
  const UniqueFd parent_fd = openSafeParent(parent, log_dir ? "--log_dir" : env::kTmpDir);
  const std::string prefix = log_dir ? run_id + "_" : "ddprun-" + run_id + "_";
  // mkdtemp's work, relative to the directory just checked: a name no one has, made 0700.
  std::string name;
  for (int tries = 0;; ++tries) {
    name = prefix + randomSuffix();
    if (::mkdirat(parent_fd.get(), name.c_str(), 0700) == 0) break;
    const int err = errno;
    if (err == EEXIST && tries < 100) continue;
    const std::string pattern = (fs::path(parent) / (prefix + "XXXXXX")).string();
    if (log_dir) throw UsageError("--log_dir " + *log_dir + ": cannot create run directory: " + std::strerror(err));
    throw SystemError("mkdir(" + pattern + ")", err);
  }
  run_dir_ = (fs::path(parent) / name).string();
  run_fd_.reset(::openat(parent_fd.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!run_fd_) throw SystemError("open " + run_dir_, errno);
  struct stat st {};
  if (::fstat(run_fd_.get(), &st) != 0) throw SystemError("fstat " + run_dir_, errno);
  if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    throw SystemError("open " + run_dir_, EPERM, "; not the private directory ddprun has just made");
  }
}

LogLayout::~LogLayout() {
  std::error_code ec;
  if (remove_on_exit_) {
    fs::remove_all(run_dir_, ec);
    return;
  }
  // The directory stays for its logs, events and stacks; the job's secrets and hook go. Error
  // codes throughout: nothing may throw out of a destructor.
  fs::remove_all(pythonHookDir(), ec);
  const fs::directory_iterator end;
  for (fs::directory_iterator attempt(run_dir_, ec); !ec && attempt != end; attempt.increment(ec)) {
    if (attempt->path().filename().string().rfind("attempt_", 0) != 0) continue;
    std::error_code worker_ec;
    for (fs::directory_iterator worker(attempt->path(), worker_ec); !worker_ec && worker != end;
         worker.increment(worker_ec)) {
      std::error_code remove_ec;
      fs::remove(secretFile(worker->path().string()), remove_ec);
    }
  }
}

std::string LogLayout::attemptDir(int attempt) const {
  const std::string name = "attempt_" + std::to_string(attempt);
  makeSubdirectory(run_fd_.get(), name, run_dir_ + "/" + name);
  return run_dir_ + "/" + name;
}

std::string LogLayout::workerDir(int attempt, int local_rank) const {
  const std::string attempt_name = "attempt_" + std::to_string(attempt);
  const std::string rank_name = std::to_string(local_rank);
  const UniqueFd attempt_fd = makeSubdirectory(run_fd_.get(), attempt_name, run_dir_ + "/" + attempt_name);
  makeSubdirectory(attempt_fd.get(), rank_name, run_dir_ + "/" + attempt_name + "/" + rank_name);
  return run_dir_ + "/" + attempt_name + "/" + rank_name;
}

}  // namespace ddprun::agent
