#include "agent/output/log_layout.h"
#include "common/env_names.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/error.h"

namespace ddprun::agent {
namespace fs = std::filesystem;
namespace {

std::string createDirectories(std::string dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw SystemError("create_directories(" + dir + ")", ec.value());
  return dir;
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
  std::string prefix = log_dir ? run_id + "_" : "ddprun-" + run_id + "_";
  std::string pattern = (fs::path(parent) / (prefix + "XXXXXX")).string();
  std::vector<char> templ(pattern.begin(), pattern.end());
  templ.push_back('\0');
  if (::mkdtemp(templ.data()) == nullptr) {
    int err = errno;
    if (log_dir) throw UsageError("--log_dir " + *log_dir + ": cannot create run directory: " + std::strerror(err));
    throw SystemError("mkdtemp(" + pattern + ")", err);
  }
  run_dir_ = templ.data();
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
  return createDirectories(run_dir_ + "/attempt_" + std::to_string(attempt));
}

std::string LogLayout::workerDir(int attempt, int local_rank) const {
  return createDirectories(run_dir_ + "/attempt_" + std::to_string(attempt) + "/" + std::to_string(local_rank));
}

}  // namespace ddprun::agent
