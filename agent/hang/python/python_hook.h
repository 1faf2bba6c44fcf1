// ddprun's startup hook for Python workers: a sitecustomize.py that the agent writes into
// its run directory and puts first on the workers' PYTHONPATH, so that no user code changes.
// In each interpreter it (0) has torch.distributed's calls recorded in flight recorder
// rings (pythonHookFiles), (1) registers faulthandler for kPythonStacksSignal, writing every
// thread's traceback into py_stacks.<pid> of the worker's directory when the agent asks,
// without stopping the process; (2) saves an uncaught exception's traceback into
// py_exception.<pid> there (then calls the previous sys.excepthook); (3) removes its own
// directory from sys.path and runs the sitecustomize that would have run without it (the
// user's, Debian's), so that nothing else changes.
#pragma once

#include <sys/types.h>

#include <csignal>
#include <map>
#include <string>
#include <vector>

namespace ddprun::agent {

// SIGURG: ignored by default, so a process that has not registered the hook (yet) is not
// harmed by it; no training stack uses TCP urgent data.
inline constexpr int kPythonStacksSignal = SIGURG;

// The hook's files (agent/hang/python/, compiled in): sitecustomize.py first, then
// _ddprun_progress.py, which records the worker's torch.distributed calls in flight
// recorder rings (common/flight_ring.h) in DDPRUN_FLIGHT_DIR, the agent's --hang_timeout's
// progress signal for Python workers.
struct PythonHookFile {
  std::string name;
  std::string text;
};
const std::vector<PythonHookFile>& pythonHookFiles();
// The text of the sitecustomize.py.
const std::string& pythonHookSource();

// Makes `dir` (mode 0700) and writes the hook's files into it. Throws SystemError, also when
// `dir` exists already: what it holds would run in every Python worker, so ddprun uses only
// a directory it has just made itself.
void writePythonHook(const std::string& dir);

// Adds the hook to a worker's environment: `hook_dir` first on PYTHONPATH, the stacks
// directory and the signal.
void addPythonHook(std::map<std::string, std::string>& env, const std::string& hook_dir, const std::string& stacks_dir);

// torch's flight recorder variables for a worker (torch 2.2 through 2.11; both names where
// torch renamed one): a trace buffer of kTorchTraceEntries entries, a dump on timeout, and the
// dump files' prefix `dump_prefix` (torch appends the rank). A variable the user set is kept,
// and so is the other name of a renamed pair the user set one of.
inline constexpr int kTorchTraceEntries = 4000;
void addTorchFlightRecorder(std::map<std::string, std::string>& env, const std::string& dump_prefix);

// The pids that registered the hook in `stacks_dir` (a py_stacks.<pid> file), ascending.
std::vector<pid_t> registeredPythonPids(const std::string& stacks_dir);
std::string pythonStacksFile(const std::string& stacks_dir, pid_t pid);
std::string pythonExceptionFile(const std::string& stacks_dir, pid_t pid);

// The last exception traceback any process of the worker saved in `stacks_dir` ("" if none),
// at most 1 MiB of it. Only regular files count. Never blocks, never throws.
std::string readPythonException(const std::string& stacks_dir);

// At most `max_bytes` of the file at `path`; "" when it cannot be read. The path is a
// worker's (py_stacks.<pid>, py_exception.<pid>): read with readWorkerFile
// (common/worker_file.h), so a FIFO, a device or a symbolic link there is not read (and
// a warning says so) instead of blocking the agent. Never blocks, never throws.
std::string readSmallFile(const std::string& path, size_t max_bytes = size_t{1} << 20);

}  // namespace ddprun::agent
