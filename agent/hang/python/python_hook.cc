#include "agent/hang/python/python_hook.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <string_view>

#include "agent/hang/python/python_hook_files.h"  // generated from agent/hang/python/
#include "common/env_names.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/unique_fd.h"
#include "common/worker_file.h"

namespace ddprun::agent {

const std::vector<PythonHookFile>& pythonHookFiles() {
  static const std::vector<PythonHookFile> files = [] {
    std::vector<PythonHookFile> out;
    for (const auto& f : generated::kPythonHookFiles) out.push_back({std::string(f.name), std::string(f.text)});
    return out;
  }();
  return files;
}

const std::string& pythonHookSource() { return pythonHookFiles().front().text; }

void writePythonHook(const std::string& dir) {
  // Every Python worker runs what this directory holds, so it must be the one made here: one
  // that is already there may be another user's (a run directory swapped in an unsafe
  // parent) or a worker's of an earlier run, with a sitecustomize.py of its own.
  if (::mkdir(dir.c_str(), 0700) != 0) {
    const int err = errno;
    if (err == EEXIST) throw SystemError("mkdir " + dir, err, "; ddprun makes its Python hook's directory itself");
    throw SystemError("mkdir " + dir, err);
  }
  UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir_fd) throw SystemError("open " + dir, errno);
  struct stat st {};
  if (::fstat(dir_fd.get(), &st) != 0) throw SystemError("fstat " + dir, errno);
  if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    throw SystemError("open " + dir, EPERM, "; not the private directory ddprun has just made");
  }
  for (const PythonHookFile& file : pythonHookFiles()) {
    const std::string path = dir + "/" + file.name;
    UniqueFd fd(::openat(dir_fd.get(), file.name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd) throw SystemError("create " + path, errno);
    std::string_view rest = file.text;
    while (!rest.empty()) {
      const ssize_t n = ::write(fd.get(), rest.data(), rest.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw SystemError("write " + path, errno);
      rest.remove_prefix(static_cast<size_t>(n));
    }
    if (const int err = fd.close(); err != 0) throw SystemError("write " + path, err);
  }
}

void addPythonHook(std::map<std::string, std::string>& env, const std::string& hook_dir,
                   const std::string& stacks_dir) {
  auto path = env.find(env::kPythonPath);
  const bool has_path = path != env.end() && !path->second.empty();
  env[env::kPythonPath] = has_path ? hook_dir + ":" + path->second : hook_dir;
  env[env::kPythonStacksDir] = stacks_dir;
  env[env::kPythonStacksSignal] = std::to_string(kPythonStacksSignal);
}

void addTorchFlightRecorder(std::map<std::string, std::string>& env, const std::string& dump_prefix) {
  auto setPair = [&env](const char* older, const char* newer, const std::string& value) {
    if (env.count(older) || env.count(newer)) return;
    env[older] = value;
    env[newer] = value;
  };
  setPair(env::kTorchNcclTraceBufferSize, env::kTorchFrBufferSize, std::to_string(kTorchTraceEntries));
  env.try_emplace(env::kTorchNcclDumpOnTimeout, "1");
  setPair(env::kTorchNcclDebugInfoTempFile, env::kTorchFrDumpTempFile, dump_prefix);
}

std::string pythonStacksFile(const std::string& stacks_dir, pid_t pid) {
  return stacks_dir + "/py_stacks." + std::to_string(pid);
}

std::string pythonExceptionFile(const std::string& stacks_dir, pid_t pid) {
  return stacks_dir + "/py_exception." + std::to_string(pid);
}

namespace {

std::vector<pid_t> pidsWithPrefix(const std::string& dir, const std::string& prefix) {
  std::vector<pid_t> pids;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    pids.push_back(static_cast<pid_t>(std::stol(digits)));
  }
  std::sort(pids.begin(), pids.end());
  return pids;
}

}  // namespace

std::vector<pid_t> registeredPythonPids(const std::string& stacks_dir) {
  return pidsWithPrefix(stacks_dir, "py_stacks.");
}

std::string readPythonException(const std::string& stacks_dir) {
  std::string newest;
  std::filesystem::file_time_type newest_time{};
  for (pid_t pid : pidsWithPrefix(stacks_dir, "py_exception.")) {
    const std::string path = pythonExceptionFile(stacks_dir, pid);
    // The time only orders the candidates; readSmallFile checks the file it opens.
    std::error_code ec;
    const auto status = std::filesystem::symlink_status(path, ec);
    if (ec || !std::filesystem::is_regular_file(status)) continue;
    const auto t = std::filesystem::last_write_time(path, ec);
    if (ec || (!newest.empty() && t < newest_time)) continue;
    newest = path;
    newest_time = t;
  }
  return newest.empty() ? std::string() : readSmallFile(newest);
}

std::string readSmallFile(const std::string& path, size_t max_bytes) {
  WorkerFile file = readWorkerFile(path, max_bytes);
  if (!file.ok() && !file.missing()) logger("agent")->warn("{}", file.problem);
  return std::move(file.bytes);
}

}  // namespace ddprun::agent
