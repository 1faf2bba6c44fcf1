#include "bench/store_scale_server.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <thread>

#include "bench/store_scale_clients.h"  // nowNs

namespace ddprun::bench::store_scale {
namespace {

// The number at the start of `text` (after blanks), or `fallback` when there is none.
template <class T>
T leadingNumber(std::string_view text, T fallback) {
  const size_t start = text.find_first_not_of(" \t");
  if (start == std::string_view::npos) return fallback;
  T value{};
  const auto [end, ec] = std::from_chars(text.data() + start, text.data() + text.size(), value);
  return ec == std::errc() && end != text.data() + start ? value : fallback;
}

}  // namespace

double statusMiB(pid_t pid, const char* field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0)
      return leadingNumber<double>(std::string_view(line).substr(prefix.size()), 0) / 1024.0;
  }
  return 0;
}

long long listenOverflows() {
  std::ifstream in("/proc/net/netstat");
  std::string names, values;
  while (std::getline(in, names) && std::getline(in, values)) {
    if (names.rfind("TcpExt:", 0) != 0) continue;
    std::istringstream n(names), v(values);
    std::string name, value;
    while (n >> name && v >> value) {
      if (name == "ListenOverflows") return leadingNumber<long long>(value, -1);
    }
  }
  return -1;
}

double cpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream fields(text.substr(paren + 2));
  std::string f;
  double ticks = 0;
  for (int k = 3; fields >> f; ++k) {  // field 3 is the state; 14 utime, 15 stime
    if (k == 14 || k == 15) ticks += leadingNumber<double>(f, 0);
    if (k == 15) break;
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

void killAndReap(pid_t pid, int signal, double grace_s) {
  if (pid <= 0) return;
  ::kill(pid, signal);
  const int64_t deadline = nowNs() + static_cast<int64_t>(grace_s * 1e9);
  for (;;) {
    pid_t r = waitpid(pid, nullptr, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) return;
    if (nowNs() > deadline) {
      ::kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::pair<pid_t, int> startServer(const std::string& path, rlim_t soft, rlim_t hard) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    rlimit limit{soft, hard};
    setrlimit(RLIMIT_NOFILE, &limit);
    dup2(out[1], STDOUT_FILENO);
    const char* argv[] = {path.c_str(), "--host", "127.0.0.1", "--port", "0", nullptr};
    execv(path.c_str(), const_cast<char* const*>(argv));
    std::fprintf(stderr, "store_scale: exec %s: %s\n", path.c_str(), std::strerror(errno));
    _exit(127);
  }
  ::close(out[1]);
  std::string text;
  const int64_t deadline = nowNs() + 60'000'000'000;
  int port = 0;
  while (port == 0 && nowNs() < deadline) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buffer[256];
    const ssize_t n = ::read(out[0], buffer, sizeof buffer);
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
    const size_t at = text.find("listening on ");
    if (at != std::string::npos && text.find('\n', at) != std::string::npos)
      port = leadingNumber<int>(std::string_view(text).substr(at + 13), 0);
  }
  ::close(out[0]);
  if (port == 0) {
    killAndReap(pid, SIGKILL, 1);
    throw std::runtime_error(path + " did not print 'listening on PORT' within 60 s");
  }
  return {pid, port};
}

}  // namespace ddprun::bench::store_scale
