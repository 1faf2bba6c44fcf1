// Where a run's per-worker files live:
//   <log_dir>/<run_id>_<unique>/attempt_<k>/<local_rank>/{stdout.log,stderr.log,error.json,stacks.txt}
//   <log_dir>/<run_id>_<unique>/attempt_<k>/filtered_{stdout,stderr}.log (--duplicate_*_filters)
//   <log_dir>/<run_id>_<unique>/python_hook/ (ddprun's hook for Python workers)
// Without --log_dir the same tree is made under $TMPDIR and, unless the user asked for
// redirected or teed output (or ddprun took a hung worker's stacks into it), removed when the run ends.
// A run directory that stays loses, when the run ends, what only the running job needed: each
// worker's rpc_secret (a secret of the job's own has no business outliving it) and the hook.
#pragma once

#include <sys/stat.h>

#include <optional>
#include <string>

#include "common/unique_fd.h"

namespace ddprun::agent {

class LogLayout {
 public:
  // Creates the run directory (mode 0700) in `log_dir`, else in $TMPDIR (else /tmp), through
  // a descriptor of that parent, and keeps a descriptor of it for the directories made in it.
  // Throws UsageError when `log_dir` cannot be created or written, or the parent is unsafe
  // (unsafeDirectoryReason: another user could swap the run directory, and with it the
  // Python hook every worker runs), SystemError for other failures.
  LogLayout(const std::optional<std::string>& log_dir, const std::string& run_id, bool keep_temporary);
  ~LogLayout();
  LogLayout(const LogLayout&) = delete;
  LogLayout& operator=(const LogLayout&) = delete;

  const std::string& runDir() const { return run_dir_; }
  // True when the run directory is a temporary one that the destructor removes.
  bool isTemporary() const { return remove_on_exit_; }
  // Keeps a temporary run directory after all: it holds something the user is told about.
  void keep() { remove_on_exit_ = false; }

  // Creates (if needed) and returns attempt_<k>/, relative to the run directory's descriptor
  // (a symbolic link there is refused). Throws SystemError.
  std::string attemptDir(int attempt) const;
  // Creates (if needed) and returns attempt_<k>/<local_rank>/, as attemptDir does.
  std::string workerDir(int attempt, int local_rank) const;
  static std::string stdoutFile(const std::string& worker_dir) { return worker_dir + "/stdout.log"; }
  static std::string stderrFile(const std::string& worker_dir) { return worker_dir + "/stderr.log"; }
  static std::string errorFile(const std::string& worker_dir) { return worker_dir + "/error.json"; }
  // The worker's RPC secret (DDPRUN_RPC_SECRET_FILE), removed when the run ends.
  static std::string secretFile(const std::string& worker_dir) { return worker_dir + "/rpc_secret"; }
  // ddprun's sitecustomize.py for Python workers, removed when the run ends.
  std::string pythonHookDir() const { return run_dir_ + "/python_hook"; }
  // torchrun's names for the --duplicate_*_filters files, in the attempt directory.
  static std::string filteredStdoutFile(const std::string& attempt_dir) { return attempt_dir + "/filtered_stdout.log"; }
  static std::string filteredStderrFile(const std::string& attempt_dir) { return attempt_dir + "/filtered_stderr.log"; }

 private:
  std::string run_dir_;
  UniqueFd run_fd_;  // the run directory as made, whatever its path comes to name
  bool remove_on_exit_ = false;
};

// Why a run directory must not be made in the directory `st` describes ("" when it may):
// one that another user owns (root aside), or that its group or others may write without
// the sticky bit (/tmp's mode 1777 is fine), lets that user rename the run directory and
// put one of their own in its place.
std::string unsafeDirectoryReason(const struct stat& st);

// Checks that `dir` (--log_dir) exists or can be created, is writable, and is safe
// (unsafeDirectoryReason). Throws UsageError, one line naming the path.
void ensureWritableDirectory(const std::string& dir);

}  // namespace ddprun::agent
