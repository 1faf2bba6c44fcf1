// store_scale: the workers' store at the scale of the largest jobs. N clients, each a real TCP
// connection, run torch's TCPStore start-up sequence against a store server in a process of its
// own, and the same load is then run against torch's own store server, in the same invocation.
//
// Per client i (of N), in torch's wire protocol:
//   [VALIDATE magic]          current generation only (torch 2.x); torch 1.13 has no handshake
//   SET rank/i = its address  (no reply)
//   ADD count 1               -> total; the client that sees total == N SETs `barrier`
//   WAIT barrier              -> STOP_WAITING once the last client has arrived
//   GET rank/(i+1)%N          -> its peer's value, checked
// seconds: from the moment the client processes are released until the last client's GET of its
// peer's key has been answered (the last barrier release). The server's peak RSS is its VmHWM,
// its CPU the user+system time it used during the run (/proc/PID/stat).
//
// The clients are P processes (fork, each an epoll loop over its share of non-blocking sockets;
// P: the cores, more if one process's descriptor limit cannot hold its share). Each socket is
// bound to its own source address in 127.0.0.0/8 before connect (IP_BIND_ADDRESS_NO_PORT), 64
// clients per address, so the ephemeral port range never limits the run. The servers are
// separate programs that print "listening on PORT": ddprun's `ddprun_store_server` (the server
// the agent serves its workers with, StoreServer) and `store_scale_torch_server` (LibTorch's
// c10d::TCPStore master daemon). ddprun's server is started with the soft descriptor limit the
// shell had (it raises its own soft limit to the hard one); torch's with soft = hard, as a torch
// user who ran `ulimit -n` would. When this program may (root), it raises the hard limit to
// what N clients need first; else it says what to raise.
//
// Usage: store_scale [CLIENTS] [--procs P] [--timeout S] [--torch-timeout S] [--no-torch]
//                    [--server PATH] [--torch-server PATH] [--torch-wire current|1.13]
// Last line: `store_scale clients=N seconds=S rss_mb=M torch_seconds=T ratio=R` (ratio: torch's
// seconds over ddprun's; a torch run cut by --torch-timeout reports the cut, a lower bound, and
// a '#' line says so). Exit status: 0 when every client of ddprun's server was released and got
// its peer's value, 1 otherwise, 2 for bad arguments.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

constexpr uint32_t kValidationMagic = 0x3C85F7CE;
constexpr int kClientsPerAddress = 64;
constexpr int kSpareDescriptors = 64;

enum class Wire { kCurrent, kLegacy };

// Command bytes of the two generations (rendezvous/store/wire_protocol.h, rendezvous/PROTOCOL.md).
struct Codes {
  uint8_t set, get, add, wait;
};
Codes codesOf(Wire wire) { return wire == Wire::kCurrent ? Codes{1, 3, 4, 6} : Codes{0, 2, 3, 5}; }
const char* wireName(Wire wire) { return wire == Wire::kCurrent ? "current" : "1.13"; }

int64_t nowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}
void putBytes(std::string& out, const std::string& bytes) {
  put<uint64_t>(out, bytes.size());
  out += bytes;
}

std::string keyOf(int rank) { return "rank/" + std::to_string(rank); }
// What a rank publishes at start-up: an address, as torch's ranks do.
std::string valueOf(int rank) {
  return "127.0.0.1:" + std::to_string(20000 + rank % 40000) + "/rank" + std::to_string(rank);
}

// Source address of client `rank`: 127.1.0.1 upwards, skipping .0 and .255 last bytes.
in_addr_t sourceAddress(int rank) {
  const uint32_t k = static_cast<uint32_t>(rank / kClientsPerAddress);
  const uint32_t host = (1u << 16) + (k / 254) * 256 + 1 + k % 254;
  return htonl((127u << 24) | host);
}

std::string addressText(in_addr_t address) {
  char text[INET_ADDRSTRLEN] = {};
  in_addr a{};
  a.s_addr = address;
  inet_ntop(AF_INET, &a, text, sizeof text);
  return text;
}

// What one client process reports to the parent through a pipe.
struct ClientReport {
  int32_t released = 0;  // clients whose GET of their peer's key was answered with its value
  int32_t wrong = 0;     // ... answered with something else
  int32_t failed = 0;    // connect or I/O failures, closed connections
  int32_t unfinished = 0;
  int64_t last_release_ns = 0;
  int64_t last_connect_ns = 0;  // when the last connection was established
  int64_t last_add_ns = 0;      // when the last ADD was answered
  char first_error[160] = {};
};

class ClientProcess {
 public:
  ClientProcess(int first_rank, int count, int world, int port, Wire wire, int64_t deadline_ns)
      : first_(first_rank), world_(world), port_(port), codes_(codesOf(wire)), wire_(wire), deadline_(deadline_ns) {
    clients_.resize(static_cast<size_t>(count));
  }

  ClientReport run() {
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_ < 0) return failAll(std::string("epoll_create1: ") + std::strerror(errno));
    for (size_t i = 0; i < clients_.size(); ++i) start(i);
    std::vector<epoll_event> events(1024);
    while (open_ > 0) {
      const int64_t left_ms = (deadline_ - nowNs()) / 1000000;
      if (left_ms <= 0) break;
      const int n = epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), static_cast<int>(left_ms));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        error(std::string("epoll_wait: ") + std::strerror(errno));
        break;
      }
      for (int e = 0; e < n; ++e) onEvent(events[e].data.u32, events[e].events);
    }
    report_.unfinished = open_;
    return report_;
  }

 private:
  enum class Phase : uint8_t { kConnecting, kAdd, kWait, kGet, kDone, kFailed };
  struct Client {
    int fd = -1;
    Phase phase = Phase::kConnecting;
    std::string in;
    std::string out;
  };

  ClientReport failAll(const std::string& why) {
    error(why);
    report_.failed = static_cast<int32_t>(clients_.size());
    return report_;
  }

  void error(const std::string& why) {
    if (report_.first_error[0] == 0) std::snprintf(report_.first_error, sizeof report_.first_error, "%s", why.c_str());
  }

  int rankOf(size_t i) const { return first_ + static_cast<int>(i); }

  void start(size_t i) {
    Client& c = clients_[i];
    const int rank = rankOf(i);
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) return fail(i, std::string("socket: ") + std::strerror(errno));
    ++open_;
    const int one = 1;
    setsockopt(c.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in source{};
    source.sin_family = AF_INET;
    source.sin_addr.s_addr = sourceAddress(rank);
    if (::bind(c.fd, reinterpret_cast<sockaddr*>(&source), sizeof source) != 0) {
      return fail(i, "bind " + addressText(source.sin_addr.s_addr) + ": " + std::strerror(errno));
    }
    sockaddr_in server{};
    server.sin_family = AF_INET;
    server.sin_port = htons(static_cast<uint16_t>(port_));
    server.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(c.fd, reinterpret_cast<sockaddr*>(&server), sizeof server) != 0 && errno != EINPROGRESS) {
      return fail(i, std::string("connect: ") + std::strerror(errno));
    }
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.u32 = static_cast<uint32_t>(i);
    if (epoll_ctl(epoll_, EPOLL_CTL_ADD, c.fd, &ev) != 0) fail(i, std::string("epoll_ctl: ") + std::strerror(errno));
  }

  void fail(size_t i, const std::string& why) {
    error("rank " + std::to_string(rankOf(i)) + ": " + why);
    ++report_.failed;
    finish(i, Phase::kFailed);
  }

  // The connection stays open until the process exits (torch's clients keep theirs), but is
  // no longer watched.
  void finish(size_t i, Phase phase) {
    Client& c = clients_[i];
    if (c.fd >= 0) {
      epoll_ctl(epoll_, EPOLL_CTL_DEL, c.fd, nullptr);
      if (phase == Phase::kFailed) {
        ::close(c.fd);
        c.fd = -1;
      }
      --open_;
    }
    c.phase = phase;
    std::string().swap(c.in);
    std::string().swap(c.out);
  }

  void watch(size_t i) {
    Client& c = clients_[i];
    epoll_event ev{};
    ev.events = EPOLLIN | (c.out.empty() ? 0u : static_cast<uint32_t>(EPOLLOUT));
    ev.data.u32 = static_cast<uint32_t>(i);
    epoll_ctl(epoll_, EPOLL_CTL_MOD, c.fd, &ev);
  }

  void send(size_t i, std::string bytes) {
    Client& c = clients_[i];
    const bool was_empty = c.out.empty();
    c.out += bytes;
    flush(i);
    if (c.phase != Phase::kFailed && was_empty != c.out.empty()) watch(i);
  }

  void flush(size_t i) {
    Client& c = clients_[i];
    while (!c.out.empty()) {
      const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0) return fail(i, std::string("send: ") + std::strerror(errno));
      c.out.erase(0, static_cast<size_t>(n));
    }
  }

  void onEvent(uint32_t i, uint32_t events) {
    Client& c = clients_[i];
    if (c.phase == Phase::kDone || c.phase == Phase::kFailed) return;
    if (c.phase == Phase::kConnecting) {
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return fail(i, std::string("connect: ") + std::strerror(err));
      if (!(events & EPOLLOUT)) return;
      c.phase = Phase::kAdd;
      report_.last_connect_ns = std::max(report_.last_connect_ns, nowNs());
      std::string request;
      if (wire_ == Wire::kCurrent) {
        put<uint8_t>(request, 0);
        put<uint32_t>(request, kValidationMagic);
      }
      const int rank = rankOf(i);
      put<uint8_t>(request, codes_.set);
      putBytes(request, keyOf(rank));
      putBytes(request, valueOf(rank));
      put<uint8_t>(request, codes_.add);
      putBytes(request, "count");
      put<int64_t>(request, 1);
      c.out = std::move(request);
      flush(i);
      if (c.phase != Phase::kFailed) watch(i);
      return;
    }
    if (events & EPOLLOUT) {
      flush(i);
      if (c.phase == Phase::kFailed) return;
      if (c.out.empty()) watch(i);
    }
    if (!(events & (EPOLLIN | EPOLLERR | EPOLLHUP))) return;
    char buffer[4096];
    for (;;) {
      const ssize_t n = ::recv(c.fd, buffer, sizeof buffer, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0) return fail(i, std::string("recv: ") + std::strerror(errno));
      if (n == 0) return fail(i, "the server closed the connection");
      c.in.append(buffer, static_cast<size_t>(n));
      if (static_cast<size_t>(n) < sizeof buffer) break;
    }
    advance(i);
  }

  // Consumes the replies that have arrived and sends the next request.
  void advance(uint32_t i) {
    Client& c = clients_[i];
    for (;;) {
      if (c.phase == Phase::kAdd) {
        if (c.in.size() < sizeof(int64_t)) return;
        int64_t total = 0;
        std::memcpy(&total, c.in.data(), sizeof total);
        c.in.erase(0, sizeof total);
        c.phase = Phase::kWait;
        report_.last_add_ns = std::max(report_.last_add_ns, nowNs());
        std::string request;
        if (total == world_) {
          put<uint8_t>(request, codes_.set);
          putBytes(request, "barrier");
          putBytes(request, "go");
        }
        put<uint8_t>(request, codes_.wait);
        put<uint64_t>(request, 1);
        putBytes(request, "barrier");
        send(i, std::move(request));
      } else if (c.phase == Phase::kWait) {
        if (c.in.empty()) return;
        if (c.in[0] != 0) return fail(i, "WAIT answered " + std::to_string(static_cast<uint8_t>(c.in[0])));
        c.in.erase(0, 1);
        c.phase = Phase::kGet;
        std::string request;
        put<uint8_t>(request, codes_.get);
        putBytes(request, keyOf((rankOf(i) + 1) % world_));
        send(i, std::move(request));
      } else if (c.phase == Phase::kGet) {
        if (c.in.size() < sizeof(uint64_t)) return;
        uint64_t len = 0;
        std::memcpy(&len, c.in.data(), sizeof len);
        if (c.in.size() < sizeof len + len) return;
        const bool right = c.in.compare(sizeof len, len, valueOf((rankOf(i) + 1) % world_)) == 0;
        report_.last_release_ns = std::max(report_.last_release_ns, nowNs());
        if (right) {
          ++report_.released;
        } else {
          ++report_.wrong;
          error("rank " + std::to_string(rankOf(i)) + ": wrong value for its peer's key");
        }
        return finish(i, Phase::kDone);
      } else {
        return;
      }
      if (c.phase == Phase::kFailed) return;
    }
  }

  int first_;
  int world_;
  int port_;
  Codes codes_;
  Wire wire_;
  int64_t deadline_;
  int epoll_ = -1;
  int open_ = 0;
  std::vector<Client> clients_;
  ClientReport report_;
};

struct Config {
  int clients = 98304;
  int procs = 0;  // 0: chosen from the cores and the descriptor limit
  double timeout_s = 120;
  double torch_timeout_s = 120;
  bool torch = true;
  std::string server;
  std::string torch_server;
  // The wire of the LibTorch the torch server was built against (bench/CMakeLists.txt says
  // which): torch 2.x servers drop a client that does not VALIDATE first.
#if DDPRUN_STORE_SCALE_TORCH2
  Wire torch_wire = Wire::kCurrent;
#else
  Wire torch_wire = Wire::kLegacy;
#endif
};

struct RunResult {
  std::string name;
  Wire wire = Wire::kCurrent;
  int procs = 0;
  int released = 0, wrong = 0, failed = 0, unfinished = 0;
  double connect_s = 0, add_s = 0;  // until the last connection was up, the last ADD answered
  double seconds = 0;               // until the last release (or the cut, when not every client was released)
  bool cut = false;                 // the deadline passed before every client was released
  double rss_base_mb = 0, rss_peak_mb = 0, cpu_s = 0;
  long long overflows = 0;  // SYNs dropped at the full accept queue during the run
  std::string first_error;
};

// The number at the start of `text` (after blanks), or `fallback` when there is none.
template <class T>
T leadingNumber(std::string_view text, T fallback) {
  const size_t start = text.find_first_not_of(" \t");
  if (start == std::string_view::npos) return fallback;
  T value{};
  const auto [end, ec] = std::from_chars(text.data() + start, text.data() + text.size(), value);
  return ec == std::errc() && end != text.data() + start ? value : fallback;
}

// A field of /proc/PID/status in kB, as MiB.
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

// TcpExt ListenOverflows of this network namespace: connections whose SYN was dropped because a
// listener's accept queue was full (each such client retries after 1 s, then 3, 7, ...).
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

// User + system CPU seconds of every thread of PID so far.
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

// Starts SERVER (which prints "listening on PORT") with the given descriptor limits; returns
// its pid and port.
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

RunResult runOne(const std::string& name, const std::string& server_path, Wire wire, const Config& config,
                 double timeout_s, rlim_t server_soft, rlim_t server_hard, int procs) {
  RunResult result;
  result.name = name;
  result.wire = wire;
  result.procs = procs;
  auto [server_pid, port] = startServer(server_path, server_soft, server_hard);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  result.rss_base_mb = statusMiB(server_pid, "VmRSS");
  const double cpu_start = cpuSeconds(server_pid);

  int start_pipe[2], finish_pipe[2];
  if (pipe2(start_pipe, O_CLOEXEC) != 0 || pipe2(finish_pipe, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  std::vector<pid_t> children;
  std::vector<int> report_fds;
  const int per = (config.clients + procs - 1) / procs;
  const int64_t deadline_ns = nowNs() + static_cast<int64_t>(timeout_s * 1e9);
  for (int p = 0; p < procs; ++p) {
    const int first = p * per;
    const int count = std::min(per, config.clients - first);
    if (count <= 0) break;
    int report[2];
    if (pipe2(report, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::close(start_pipe[1]);
      ::close(finish_pipe[1]);
      ::close(report[0]);
      char go = 0;
      ClientReport r;
      if (::read(start_pipe[0], &go, 1) == 1) {
        ClientProcess client(first, count, config.clients, port, wire, deadline_ns);
        r = client.run();
      } else {
        r.failed = count;
      }
      if (::write(report[1], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) _exit(1);
      // Connections stay open until every process has reported (the parent closes the pipe).
      while (::read(finish_pipe[0], &go, 1) < 0 && errno == EINTR) {
      }
      _exit(0);
    }
    ::close(report[1]);
    children.push_back(pid);
    report_fds.push_back(report[0]);
  }
  ::close(start_pipe[0]);
  ::close(finish_pipe[0]);
  const long long overflows_before = listenOverflows();
  const int64_t start_ns = nowNs();
  const std::string go(children.size(), 'g');
  if (::write(start_pipe[1], go.data(), go.size()) != static_cast<ssize_t>(go.size())) {
    throw std::runtime_error("cannot release the client processes");
  }
  int64_t last_ns = 0, connect_ns = 0, add_ns = 0;
  for (size_t p = 0; p < report_fds.size(); ++p) {
    ClientReport r;
    size_t got = 0;
    while (got < sizeof r) {
      pollfd pfd{report_fds[p], POLLIN, 0};
      const int64_t left_ms = (deadline_ns + 30'000'000'000 - nowNs()) / 1000000;
      if (left_ms <= 0 || poll(&pfd, 1, static_cast<int>(left_ms)) <= 0) break;
      const ssize_t n = ::read(report_fds[p], reinterpret_cast<char*>(&r) + got, sizeof r - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    ::close(report_fds[p]);
    if (got < sizeof r) {
      result.failed += std::min(per, config.clients - static_cast<int>(p) * per);
      if (result.first_error.empty()) result.first_error = "a client process did not report";
      continue;
    }
    result.released += r.released;
    result.wrong += r.wrong;
    result.failed += r.failed;
    result.unfinished += r.unfinished;
    last_ns = std::max(last_ns, r.last_release_ns);
    connect_ns = std::max(connect_ns, r.last_connect_ns);
    add_ns = std::max(add_ns, r.last_add_ns);
    if (result.first_error.empty() && r.first_error[0]) result.first_error = r.first_error;
  }
  result.cut = result.released + result.wrong < config.clients;
  result.seconds = result.cut ? static_cast<double>(nowNs() - start_ns) * 1e-9 : (last_ns - start_ns) * 1e-9;
  result.connect_s = connect_ns ? (connect_ns - start_ns) * 1e-9 : 0;
  result.add_s = add_ns ? (add_ns - start_ns) * 1e-9 : 0;
  result.rss_peak_mb = statusMiB(server_pid, "VmHWM");
  result.overflows = listenOverflows() - overflows_before;
  result.cpu_s = cpuSeconds(server_pid) - cpu_start;
  ::close(finish_pipe[1]);
  ::close(start_pipe[1]);
  for (pid_t pid : children) killAndReap(pid, 0, 30);  // they exit once the finish pipe closes
  killAndReap(server_pid, SIGTERM, 10);
  return result;
}

std::string siblingPath(const char* argv0, const std::string& name) {
  std::string self = argv0;
  char resolved[4096];
  const ssize_t n = readlink("/proc/self/exe", resolved, sizeof resolved - 1);
  if (n > 0) self.assign(resolved, static_cast<size_t>(n));
  const size_t slash = self.rfind('/');
  return (slash == std::string::npos ? std::string(".") : self.substr(0, slash)) + "/" + name;
}

Config parseArgs(int argc, char** argv) {
  Config c;
  c.server = siblingPath(argv[0], "ddprun_store_server");
  c.torch_server = siblingPath(argv[0], "store_scale_torch_server");
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    auto number = [&](const std::string& text) {
      size_t end = 0;
      const double v = std::stod(text, &end);
      if (end != text.size() || !(v > 0)) throw std::invalid_argument(arg + ": not a positive number: " + text);
      return v;
    };
    if (arg == "--procs") {
      c.procs = static_cast<int>(number(next()));
    } else if (arg == "--timeout") {
      c.timeout_s = number(next());
    } else if (arg == "--torch-timeout") {
      c.torch_timeout_s = number(next());
    } else if (arg == "--no-torch") {
      c.torch = false;
    } else if (arg == "--server") {
      c.server = next();
    } else if (arg == "--torch-server") {
      c.torch_server = next();
    } else if (arg == "--torch-wire") {
      const std::string w = next();
      if (w != "current" && w != "1.13") throw std::invalid_argument("--torch-wire takes current or 1.13");
      c.torch_wire = w == "current" ? Wire::kCurrent : Wire::kLegacy;
    } else if (arg == "-h" || arg == "--help") {
      std::printf(
          "usage: store_scale [CLIENTS] [--procs P] [--timeout S] [--torch-timeout S] [--no-torch]\n"
          "                   [--server PATH] [--torch-server PATH] [--torch-wire current|1.13]\n"
          "defaults: CLIENTS 98304, --timeout 120, --torch-timeout 120, --torch-wire that of the LibTorch\n"
          "          the torch server was built against (%s here);\n"
          "servers: ddprun_store_server and store_scale_torch_server beside this program\n",
          wireName(Config{}.torch_wire));
      std::exit(0);
    } else if (!arg.empty() && arg[0] != '-') {
      c.clients = static_cast<int>(number(arg));
    } else {
      throw std::invalid_argument("unknown argument " + arg);
    }
  }
  if (c.clients < 2) throw std::invalid_argument("CLIENTS must be at least 2");
  return c;
}

void printRow(const RunResult& r, int clients) {
  std::printf("%12s %8s %8d %6d %9d %6d %7d %10.3f %9.3f %9.3f%s %9.1f %9.1f %7.2f %9lld\n", r.name.c_str(),
              wireName(r.wire), clients, r.procs, r.released, r.wrong, r.failed + r.unfinished, r.connect_s, r.add_s,
              r.seconds, r.cut ? "+" : " ", r.rss_base_mb, r.rss_peak_mb, r.cpu_s, r.overflows);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Config config = parseArgs(argc, argv);
    signal(SIGPIPE, SIG_IGN);

    // Descriptors: the server needs one per client; raise the hard limit for it when allowed.
    rlimit original{};
    getrlimit(RLIMIT_NOFILE, &original);
    const rlim_t server_needs = static_cast<rlim_t>(config.clients) + kSpareDescriptors;
    rlimit raised = original;
    if (raised.rlim_max < server_needs) {
      rlimit want{server_needs, server_needs};
      if (setrlimit(RLIMIT_NOFILE, &want) == 0) raised = want;
    }
    raised.rlim_cur = raised.rlim_max;
    setrlimit(RLIMIT_NOFILE, &raised);
    getrlimit(RLIMIT_NOFILE, &raised);
    if (raised.rlim_max < server_needs) {
      std::printf(
          "# store_scale: the hard descriptor limit is %llu, below the %llu a server with %d clients needs; raise\n"
          "#   it (ulimit -Hn, nofile in /etc/security/limits.conf, LimitNOFILE= for a systemd unit)\n",
          static_cast<unsigned long long>(raised.rlim_max), static_cast<unsigned long long>(server_needs),
          config.clients);
      std::printf("# store_scale: %llu clients is the most one server process can hold here\n",
                  static_cast<unsigned long long>(
                      raised.rlim_max > kSpareDescriptors ? raised.rlim_max - kSpareDescriptors : 0));
      return 1;
    }
    const int cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
    const long per_proc_max = static_cast<long>(raised.rlim_cur) - kSpareDescriptors;
    int procs =
        config.procs > 0
            ? config.procs
            : std::max<int>(cores, static_cast<int>((config.clients + per_proc_max - 1) / std::max(1L, per_proc_max)));
    procs = std::min(procs, config.clients);

    int somaxconn = 0;
    std::ifstream("/proc/sys/net/core/somaxconn") >> somaxconn;
    std::printf(
        "# store_scale: %d clients in %d processes (epoll in each), source addresses %s-%s (%d per address);\n"
        "#   per client: [VALIDATE], SET rank/i, ADD count 1 (the last arrival SETs barrier), WAIT barrier,\n"
        "#   GET rank/(i+1)%%N, checked. %d cores, net.core.somaxconn %d, descriptors soft %llu hard %llu\n"
        "#   (ddprun's server starts with soft %llu and raises it; torch's starts with soft = hard)\n",
        config.clients, procs, addressText(sourceAddress(0)).c_str(),
        addressText(sourceAddress(config.clients - 1)).c_str(), kClientsPerAddress, cores, somaxconn,
        static_cast<unsigned long long>(original.rlim_cur), static_cast<unsigned long long>(raised.rlim_max),
        static_cast<unsigned long long>(original.rlim_cur));
    std::printf("#%11s %8s %8s %6s %9s %6s %7s %10s %9s %10s %9s %9s %7s %9s\n", "server", "wire", "clients", "procs",
                "released", "wrong", "failed", "connect(s)", "added(s)", "seconds", "rss0(MB)", "rss(MB)", "cpu(s)",
                "overflows");
    std::fflush(stdout);

    RunResult ours = runOne("ddprun", config.server, Wire::kCurrent, config, config.timeout_s,
                            std::min(original.rlim_cur, raised.rlim_max), raised.rlim_max, procs);
    printRow(ours, config.clients);
    std::fflush(stdout);
    if (!ours.first_error.empty()) std::printf("# ddprun: first error: %s\n", ours.first_error.c_str());

    std::optional<RunResult> theirs;
    if (config.torch && access(config.torch_server.c_str(), X_OK) == 0) {
      theirs = runOne("torch", config.torch_server, config.torch_wire, config, config.torch_timeout_s, raised.rlim_max,
                      raised.rlim_max, procs);
      printRow(*theirs, config.clients);
      if (!theirs->first_error.empty()) std::printf("# torch: first error: %s\n", theirs->first_error.c_str());
    } else if (config.torch) {
      std::printf("# torch's server not run: %s is missing (built where LibTorch is found)\n",
                  config.torch_server.c_str());
    }
    std::printf(
        "# connect(s), added(s), seconds: from releasing the client processes until the last connection was up,\n"
        "#   the last ADD was answered, and the last client's GET of its peer's key was answered\n"
        "#   ('+': cut at the timeout with clients still unreleased, a lower bound); rss0: the server's RSS\n"
        "#   before the clients, rss: its peak (VmHWM); cpu: its user+system CPU during the run; overflows:\n"
        "#   SYNs dropped at a full accept queue (TcpExt ListenOverflows; each costs its client 1 s or more)\n");
    const bool ok = ours.released == config.clients && ours.wrong == 0;
    double torch_seconds = 0, ratio = 0;
    if (theirs) {
      torch_seconds = theirs->seconds;
      ratio = ours.seconds > 0 ? torch_seconds / ours.seconds : 0;
      if (theirs->cut) {
        std::printf(
            "# torch's server released %d of %d clients before its %.0f s timeout: torch_seconds and ratio\n"
            "#   are lower bounds\n",
            theirs->released, config.clients, config.torch_timeout_s);
      }
    }
    std::printf("store_scale clients=%d seconds=%.3f rss_mb=%.1f torch_seconds=%.3f ratio=%.2f\n", config.clients,
                ours.seconds, ours.rss_peak_mb, torch_seconds, ratio);
    return ok ? 0 : 1;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "store_scale: %s (store_scale --help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_scale: %s\n", e.what());
    return 1;
  }
}
