#include "agent/hang/stop/stack_capture.h"
#include "common/env_names.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

#include "agent/ops/failure_report.h"
#include "agent/process/process_signals.h"
#include "common/unique_fd.h"

extern char** environ;

namespace ddprun::agent {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxOutput = 1 << 20;

bool isExecutableFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// The tool's environment: ours, less DEBUGINFOD_URLS, so that neither tool stops to
// download debug information while a worker waits, attached, to be stopped.
std::vector<std::string> toolEnvironment() {
  std::vector<std::string> env;
  for (char** entry = environ; entry && *entry; ++entry) {
    if (std::strncmp(*entry, "DEBUGINFOD_URLS=", 16) == 0) continue;
    env.emplace_back(*entry);
  }
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

struct Running {
  pid_t tool_pid = -1;
  UniqueFd out;  // the read end of its stdout and stderr
  bool exited = false;
  int status = 0;
};

// Starts the tool in a process group of its own (so that a timeout kills whatever it
// started too), its stdout and stderr into one pipe. Returns the problem, or "".
std::string startTool(const StackTool& tool, pid_t pid, std::vector<std::string>& env, Running& running) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return fmt::format("pipe2: {}", std::strerror(errno));
  UniqueFd read_end(fds[0]);
  UniqueFd write_end(fds[1]);
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDERR_FILENO);
  // The agent ignores SIGPIPE and may block signals; the tool gets the defaults.
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  std::vector<std::string> argv = stackToolCommand(tool, pid);
  std::vector<char*> argv_ptrs = pointers(argv);
  std::vector<char*> env_ptrs = pointers(env);
  const int err =
      ::posix_spawn(&running.tool_pid, tool.path.c_str(), &actions, &attr, argv_ptrs.data(), env_ptrs.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (err != 0) {
    running.tool_pid = -1;
    return fmt::format("cannot run {}: {}", tool.path, std::strerror(err));
  }
  running.out = std::move(read_end);
  return "";
}

std::string exitProblem(const std::string& tool, int status) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  if (WIFEXITED(status)) return fmt::format("{} exited with code {}", tool, WEXITSTATUS(status));
  return fmt::format("{} was killed by {}", tool, signalName(WTERMSIG(status)));
}

std::string localTime() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %Z", &tm);
  return buf;
}

}  // namespace

std::optional<StackTool> findStackTool(std::string_view path_env) {
  for (const char* name : {"eu-stack", "gdb"}) {
    std::string_view dirs = path_env;
    while (true) {
      const size_t colon = dirs.find(':');
      const std::string dir(dirs.substr(0, colon));
      // An empty entry means the current directory; a tool found there is not what the
      // operator installed, so it is skipped.
      if (!dir.empty() && dir.front() == '/') {
        const std::string candidate = dir + "/" + name;
        if (isExecutableFile(candidate)) return StackTool{name, candidate};
      }
      if (colon == std::string_view::npos) break;
      dirs.remove_prefix(colon + 1);
    }
  }
  return std::nullopt;
}

std::vector<std::string> stackToolCommand(const StackTool& tool, pid_t pid) {
  const std::string p = std::to_string(pid);
  if (tool.name == "eu-stack") return {tool.path, "-p", p};
  // -nx: no ~/.gdbinit, which could do anything (or wait for input) while the worker is attached.
  return {tool.path, "-batch", "-nx", "-p", p, "-ex", "thread apply all bt"};
}

std::vector<ProcessStacks> captureNativeStacks(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout,
                                               const AttachCheck& check) {
  std::vector<ProcessStacks> result(pids.size());
  for (size_t i = 0; i < pids.size(); ++i) result[i].pid = pids[i];
  const char* path_env = std::getenv(env::kPath);
  const std::optional<StackTool> tool = findStackTool(path_env ? path_env : "/usr/local/bin:/usr/bin:/bin");
  if (!tool) {
    for (ProcessStacks& s : result) s.problem = kNoStackToolNote;
    return result;
  }
  std::vector<std::string> env = toolEnvironment();
  std::vector<Running> running(pids.size());
  for (size_t i = 0; i < pids.size(); ++i) {
    if (check) {
      result[i].problem = check(pids[i]);
      if (!result[i].problem.empty()) continue;
    }
    result[i].tool = tool->name;
    result[i].problem = startTool(*tool, pids[i], env, running[i]);
  }
  const auto deadline = Clock::now() + timeout;
  char buf[65536];
  for (;;) {
    std::vector<pollfd> polled;
    std::vector<size_t> owner;
    for (size_t i = 0; i < running.size(); ++i) {
      if (!running[i].out) continue;
      polled.push_back(pollfd{running[i].out.get(), POLLIN, 0});
      owner.push_back(i);
    }
    if (polled.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    const int ready = ::poll(polled.data(), polled.size(), static_cast<int>(std::min<int64_t>(left, 1000)));
    if (ready < 0 && errno != EINTR) break;
    for (size_t k = 0; k < polled.size(); ++k) {
      if (polled[k].revents == 0) continue;
      Running& r = running[owner[k]];
      const ssize_t n = ::read(r.out.get(), buf, sizeof buf);
      if (n > 0) {
        std::string& text = result[owner[k]].text;
        // Past the cap the output is read and dropped, so that the tool never blocks on a full pipe.
        if (text.size() < kMaxOutput) text.append(buf, std::min(static_cast<size_t>(n), kMaxOutput - text.size()));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        r.out.reset();
      }
    }
  }
  // The tools have closed their output (or run out of time); reap them, killing those still
  // there once the deadline has passed.
  for (size_t i = 0; i < running.size(); ++i) {
    Running& r = running[i];
    if (r.tool_pid < 0) continue;
    for (;;) {
      const pid_t got = ::waitpid(r.tool_pid, &r.status, WNOHANG);
      if (got == r.tool_pid || (got < 0 && errno != EINTR)) {
        r.exited = got == r.tool_pid;
        break;
      }
      if (Clock::now() >= deadline) {
        signalGroup(r.tool_pid, SIGKILL);
        ::waitpid(r.tool_pid, &r.status, 0);
        result[i].problem = fmt::format("{} did not finish within {:.1f} s and was killed; its output so far follows",
                                        tool->name, std::chrono::duration<double>(timeout).count());
        break;
      }
      ::usleep(10000);
    }
    r.out.reset();
    if (r.exited && result[i].problem.empty()) result[i].problem = exitProblem(tool->name, r.status);
  }
  return result;
}

std::string formatStacksFile(int rank, int local_rank, const ProcessStacks& stacks, std::string_view reason) {
  std::string out = fmt::format("# native stacks of rank {} (local rank {}, pid {}), taken {} {}\n", rank, local_rank,
                                stacks.pid, localTime(), reason);
  if (!stacks.tool.empty()) out += fmt::format("# by {}\n", stacks.tool);
  if (!stacks.problem.empty()) out += fmt::format("# {}\n", stacks.problem);
  out += stacks.text;
  if (!out.empty() && out.back() != '\n') out += '\n';
  return out;
}

}  // namespace ddprun::agent
