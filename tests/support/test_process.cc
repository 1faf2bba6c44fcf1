#include "tests/support/test_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "tests/support/child_exit.h"

extern char** environ;

namespace ddprun::testing {

std::string binDir() { return DDPRUN_TEST_BIN_DIR; }
std::string sourceDir() { return DDPRUN_TEST_SOURCE_DIR; }
std::string ddprunPath() { return binDir() + "/ddprun"; }
std::string testWorkerPath() { return binDir() + "/ddprun_test_worker"; }
std::string pythonPath() {
  const char* python = std::getenv("DDPRUN_TEST_PYTHON");
  return python != nullptr && *python != '\0' ? python : "/usr/bin/python3";
}

TestProcess::TestProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  out_fd_.reset(out_pipe[0]);
  UniqueFd out_write(out_pipe[1]);
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  err_fd_.reset(err_pipe[0]);
  UniqueFd err_write(err_pipe[1]);
  // Build argv/envp before fork: the child only calls async-signal-safe functions.
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) merged[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
  }
  for (const auto& [k, v] : env) {
    if (v.empty()) {
      merged.erase(k);
    } else {
      merged[k] = v;
    }
  }
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : merged) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::setpgid(0, 0);
    int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, 0);
    ::dup2(out_write.get(), 1);
    ::dup2(err_write.get(), 2);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  ::setpgid(pid_, pid_);
  // out_write and err_write close here: the child holds the only write ends, so its exit is EOF.
}

TestProcess::~TestProcess() {
  if (!exited_) {
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
    reap(true);
  }
}

void TestProcess::pump(std::chrono::milliseconds slice) {
  pollfd fds[2] = {{out_fd_.get(), POLLIN, 0}, {err_fd_.get(), POLLIN, 0}};
  int n = ::poll(fds, 2, static_cast<int>(slice.count()));
  if (n <= 0) return;
  char buf[65536];
  for (int i = 0; i < 2; ++i) {
    if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
    ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
    if (got > 0) {
      (i == 0 ? out_ : err_).append(buf, static_cast<size_t>(got));
    } else if (got == 0) {
      (i == 0 ? out_fd_ : err_fd_).reset();
    }
  }
}

void TestProcess::reap(bool block) {
  if (exited_) return;
  int status = 0;
  if (::waitpid(pid_, &status, block ? 0 : WNOHANG) == pid_) ended(status);
}

void TestProcess::reapWithin(std::chrono::steady_clock::time_point deadline) {
  if (exited_) return;
  int status = 0;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  if (testing::reapWithin(pid_, &status, std::max(left, 0ms))) ended(status);
}

void TestProcess::ended(int status) {
  exited_ = true;
  if (WIFEXITED(status)) exit_code_ = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) term_signal_ = WTERMSIG(status);
}

std::chrono::milliseconds TestProcess::until(std::chrono::steady_clock::time_point deadline) {
  return std::max(std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()), 0ms);
}

bool TestProcess::waitForOutput(const std::string& needle, std::chrono::milliseconds timeout, int count) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (countOf(out_ + err_, needle) < count) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    if (!out_fd_ && !err_fd_) {
      // Both streams ended: the needle cannot come any more. Returns once the process has
      // exited (or at the deadline), as a wait for its output does.
      reapWithin(deadline);
      return false;
    }
    pump(until(deadline));
  }
  return true;
}

bool TestProcess::wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    reap(false);
    if (exited_ && !out_fd_ && !err_fd_) return true;
    if (std::chrono::steady_clock::now() >= deadline) return exited_;
    if (!out_fd_ && !err_fd_) {
      reapWithin(deadline);
    } else {
      pump(until(deadline));
    }
  }
}

void TestProcess::signal(int sig) { ::kill(pid_, sig); }

RunResult run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
              std::chrono::milliseconds timeout) {
  TestProcess process(argv, env);
  RunResult result;
  result.finished = process.wait(timeout);
  result.exit_code = process.exitCode();
  result.term_signal = process.termSignal();
  result.out = process.out();
  result.err = process.err();
  return result;
}

int countOf(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + needle.size())) {
    ++count;
  }
  return count;
}

TempDir::TempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/ddprun-test-XXXXXX";
  if (!::mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

int announcedPort(TestProcess& host, std::chrono::milliseconds timeout) {
  static const std::string kAnnouncement = "serving the rendezvous store on ";
  if (!host.waitForOutput(kAnnouncement, timeout)) {
    throw std::runtime_error("ddprun announced no store port within the timeout; its output:\n" + host.out() +
                             host.err());
  }
  const std::string all = host.out() + host.err();
  const auto at = all.find(kAnnouncement) + kAnnouncement.size();
  const auto colon = all.find(':', at);
  return std::stoi(all.substr(colon + 1));
}

std::unique_ptr<TestProcess> startStoreServer(int& port) {
  static const std::string kAnnouncement = "listening on ";
  auto server = std::make_unique<TestProcess>(
      std::vector<std::string>{binDir() + "/ddprun_store_server", "--host", "127.0.0.1", "--port", "0"});
  if (!server->waitForOutput(kAnnouncement, std::chrono::seconds(10))) {
    throw std::runtime_error("ddprun_store_server announced no port within 10 s; its output:\n" + server->out() +
                             server->err());
  }
  port = std::stoi(server->out().substr(server->out().find(kAnnouncement) + kAnnouncement.size()));
  return server;
}

ClosedPort::ClosedPort() : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (!fd_ || ::bind(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    throw std::runtime_error("ClosedPort: cannot bind a loopback port");
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
}

bool processAlive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string line;
  std::getline(stat, line);
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool fileExists(const std::string& path) { return std::filesystem::exists(path); }

std::vector<std::string> shmEntriesWithPrefix(const std::string& prefix) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace ddprun::testing
