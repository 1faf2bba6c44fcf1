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
// The clients are in store_scale_clients.{h,cc}, the servers' processes in store_scale_server.{h,cc}.
//
// Usage: store_scale [CLIENTS] [--procs P] [--timeout S] [--torch-timeout S] [--no-torch]
//                    [--server PATH] [--torch-server PATH] [--torch-wire current|1.13]
// Last line: `store_scale clients=N seconds=S rss_mb=M torch_seconds=T ratio=R` (ratio: torch's
// seconds over ddprun's; a torch run cut by --torch-timeout reports the cut, a lower bound, and
// a '#' line says so). Exit status: 0 when every client of ddprun's server was released and got
// its peer's value, 1 otherwise, 2 for bad arguments.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/store_scale_clients.h"
#include "bench/store_scale_server.h"

namespace {

using namespace ddprun::bench::store_scale;

constexpr int kSpareDescriptors = 64;

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
        r = runClients(first, count, config.clients, port, wire, deadline_ns);
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
