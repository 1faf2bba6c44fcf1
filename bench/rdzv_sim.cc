// rdzv_sim: the rendezvous and the agents' exchanges at scale, over real loopback sockets.
// N simulated agents, each with its own DynamicRendezvous and JobBoard exactly as an agent
// uses them, run against one store server hosted in this process (as the host agent hosts
// it). The agents live in P client processes (fork; one parked thread per agent), so that
// the store's process holds N descriptors and each client process about N/P: one process
// holding both ends of every connection runs out of descriptors long before 16,384 agents.
//
// Phases, one after the other, every agent of every process released at once:
//   round    one c10d round with --nnodes=N-1:N: all N join; checks that every RANK 0..N-1
//            and group rank 0..N-1 was handed out exactly once, with one world size
//   status   JobBoard::publishStatus twice (the first publish, then the refresh each
//            keep-alive makes); then `ddprun status`'s read (readJobStatus) of all N records
//   hang     group rank 0 judges a hang: it asks for summaries, every other agent notices
//            the request at the agent's cadence (every 2 s) and answers with a summary of 8
//            ranks; the judge must receive N-1 answers
//   events   a round's events (rendezvous_round, 8 worker_start, round_end) appended to
//            each agent's own events file, as the agent writes them: bytes per agent
//   reform   one node leaves (it ends round 0 as evicted); the other N-1 form round 1,
//            which closes after --rdzv_conf last_call_timeout (the wait for stragglers)
//   exit     the exit barrier of round 1: every agent marks its workers done and checks
//            out (markDone, finish); timed until the store's host sees `all_exited`
// For each phase: seconds, and store operations and payload bytes per agent (mean, max),
// counted by bench/counting_env.h.
// The agents of a client process are in rdzv_sim_agents.{h,cc}; this file starts the client
// processes and the store, runs the phases and checks them.
//
// Usage: rdzv_sim [participants=4096] [--procs P] [--last-call S]
// Last line: rdzv_sim participants=N seconds=S ops_per_agent=O status_seconds=... wrong=W
// (seconds: the round's)
// Exit status 0 when every check held, 1 otherwise, 2 for bad arguments.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/counting_env.h"
#include "bench/rdzv_sim_agents.h"
#include "common/env_reader.h"
#include "common/error.h"
#include "common/logging.h"
#include "rendezvous/board/job_status.h"
#include "rendezvous/rounds/round_end.h"
#include "rendezvous/store/store_server.h"

namespace {

using namespace ddprun::rendezvous;
using namespace ddprun::bench::rdzv_sim;
using ddprun::bench::CountingEnv;

constexpr int kAgentsPerProcess = 4096;

void usage(FILE* to) { std::fprintf(to, "usage: rdzv_sim [participants=4096] [--procs P] [--last-call SECONDS]\n"); }

Options parse(int argc, char** argv) {
  Options o;
  bool positional = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> std::string {
      if (i + 1 >= argc) throw ddprun::UsageError(std::string(name) + " needs a value");
      return argv[++i];
    };
    if (arg == "--procs") {
      o.procs = static_cast<int>(ddprun::env::parseInteger("--procs", value("--procs"), 1, 256));
    } else if (arg == "--last-call") {
      o.last_call_s = static_cast<int>(ddprun::env::parseInteger("--last-call", value("--last-call"), 1, 600));
    } else if (!positional && !arg.empty() && arg[0] != '-') {
      o.participants = static_cast<int>(ddprun::env::parseInteger("participants", arg, 3, 1 << 20));
      positional = true;
    } else {
      throw ddprun::UsageError("unknown argument '" + arg + "'");
    }
  }
  if (o.procs == 0) o.procs = std::max(2, (o.participants + kAgentsPerProcess - 1) / kAgentsPerProcess);
  return o;
}

struct Child {
  pid_t pid = -1;
  int commands = -1;  // parent writes phase bytes
  int reports = -1;   // parent reads PhaseHeader + rows
  int agents = 0;
};

struct PhaseResult {
  double seconds = 0;
  double server_cpu = 0;  // CPU seconds of the store's process during the phase
  int agents = 0;
  int errors = 0;
  double ops_mean = 0, bytes_mean = 0;
  int64_t ops_max = 0, bytes_max = 0;
  std::vector<AgentRow> rows;
  std::string first_error;
};

// CPU seconds this process (the store's) has used: user + system, all threads.
double processCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

PhaseResult runPhase(std::vector<Child>& children, char phase) {
  PhaseResult r;
  const double cpu_start = processCpuSeconds();
  const int64_t start = nowNs();
  for (auto& c : children) writeAll(c.commands, &phase, 1);
  int64_t end = start, ops = 0, bytes = 0;
  for (auto& c : children) {
    PhaseHeader h;
    if (!readAll(c.reports, &h, sizeof h)) throw std::runtime_error("a client process died during a phase");
    std::vector<AgentRow> rows(static_cast<size_t>(h.agents));
    if (!readAll(c.reports, rows.data(), rows.size() * sizeof(AgentRow))) {
      throw std::runtime_error("a client process died during a phase");
    }
    r.rows.insert(r.rows.end(), rows.begin(), rows.end());
    r.agents += h.agents;
    r.errors += h.errors;
    if (h.errors > 0 && r.first_error.empty()) r.first_error = h.first_error;
    end = std::max(end, h.end_ns);
    ops += h.ops_sum;
    bytes += h.bytes_sum;
    r.ops_max = std::max(r.ops_max, h.ops_max);
    r.bytes_max = std::max(r.bytes_max, h.bytes_max);
  }
  r.seconds = static_cast<double>(end - start) / 1e9;
  r.server_cpu = processCpuSeconds() - cpu_start;
  r.ops_mean = r.agents ? static_cast<double>(ops) / r.agents : 0;
  r.bytes_mean = r.agents ? static_cast<double>(bytes) / r.agents : 0;
  return r;
}

// Every group rank handed out exactly once, with its RANK base and one world size.
int wrongSeats(const PhaseResult& p, int round, int nodes) {
  std::vector<int> group_seen(static_cast<size_t>(nodes), 0);
  int wrong = 0;
  for (const auto& r : p.rows) {
    if (r.round == -1 && r.group_rank == -1) continue;  // the node that left
    if (r.round != round || r.world_size != nodes * kNprocPerNode || r.group_world_size != nodes || r.group_rank < 0 ||
        r.group_rank >= nodes || r.rank_base != r.group_rank * kNprocPerNode ||
        group_seen[static_cast<size_t>(r.group_rank)]++ != 0) {
      ++wrong;
    }
  }
  return wrong;
}

void printRow(const char* name, const PhaseResult& p, int wrong) {
  std::printf("%-8s %7d %9.3f %9.1f %8lld %11.1f %10lld %6d %8.3f\n", name, p.agents, p.seconds, p.ops_mean,
              static_cast<long long>(p.ops_max), p.bytes_mean, static_cast<long long>(p.bytes_max), wrong,
              p.server_cpu);
  if (!p.first_error.empty()) std::fprintf(stderr, "rdzv_sim: %s: %s\n", name, p.first_error.c_str());
}

void stopChildren(std::vector<Child>& children, bool kill_them) {
  for (auto& c : children) {
    if (c.commands >= 0) {
      if (!kill_them) {
        const char quit = 'q';
        (void)::write(c.commands, &quit, 1);
      }
      ::close(c.commands);
      c.commands = -1;
    }
    if (c.pid > 0 && kill_them) ::kill(c.pid, SIGKILL);
  }
  for (auto& c : children) {
    if (c.pid > 0) {
      while (::waitpid(c.pid, nullptr, 0) < 0 && errno == EINTR) {
      }
      c.pid = -1;
    }
    if (c.reports >= 0) ::close(c.reports);
  }
}

int run(Options o) {
  const int n = o.participants;
  char events_template[] = "/tmp/rdzv_sim_events.XXXXXX";
  if (!mkdtemp(events_template)) throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
  o.events_dir = events_template;
  // Removed however the run ends (the client processes have exited by then).
  struct RemoveDir {
    std::string path;
    ~RemoveDir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } remove_events_dir{o.events_dir};
  // The store's process holds one descriptor per agent. As root, raise the hard limit if it
  // is too low (the server raises its soft limit to the hard one).
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  const rlim_t server_needs = static_cast<rlim_t>(n) + 256;
  if (files.rlim_max != RLIM_INFINITY && files.rlim_max < server_needs) {
    rlimit want{server_needs, server_needs};
    if (setrlimit(RLIMIT_NOFILE, &want) != 0) {
      std::fprintf(stderr,
                   "rdzv_sim: the store's process needs %llu descriptors and the hard limit is %llu: raise it "
                   "(ulimit -Hn, /etc/security/limits.conf) or run as root\n",
                   static_cast<unsigned long long>(server_needs), static_cast<unsigned long long>(files.rlim_max));
      return 1;
    }
  }

  // Client processes first, before this process starts any thread (fork copies one thread).
  std::vector<Child> children(static_cast<size_t>(o.procs));
  int first = 0;
  for (int p = 0; p < o.procs; ++p) {
    Child& c = children[static_cast<size_t>(p)];
    c.agents = n / o.procs + (p < n % o.procs ? 1 : 0);
    int commands[2], reports[2];
    if (pipe2(commands, O_CLOEXEC) != 0 || pipe2(reports, O_CLOEXEC) != 0) {
      throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    }
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      for (int q = 0; q < p; ++q) {
        ::close(children[static_cast<size_t>(q)].commands);
        ::close(children[static_cast<size_t>(q)].reports);
      }
      ::close(commands[1]);
      ::close(reports[0]);
      int status = 0;
      try {
        int port = 0;
        if (readAll(commands[0], &port, sizeof port)) {
          serveAgents(o, first, c.agents, port, commands[0], reports[1]);
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rdzv_sim: client process: %s\n", e.what());
        status = 1;
      }
      std::fflush(nullptr);
      _exit(status);
    }
    ::close(commands[0]);
    ::close(reports[1]);
    c.pid = pid;
    c.commands = commands[1];
    c.reports = reports[0];
    first += c.agents;
  }

  try {
    StoreServerOptions server_options;
    server_options.host = "127.0.0.1";
    server_options.expected_clients = static_cast<size_t>(n);
    StoreServer server(server_options);
    const int port = server.port();
    for (auto& c : children) writeAll(c.commands, &port, sizeof port);

    std::string load;
    std::getline(std::ifstream("/proc/loadavg"), load);
    std::printf("# rdzv_sim: %d agents (%d ranks each) in %d client processes, one store server; %u cores, load %s\n",
                n, kNprocPerNode, o.procs, std::thread::hardware_concurrency(), load.c_str());
    std::printf("%-8s %7s %9s %9s %8s %11s %10s %6s %8s\n", "phase", "agents", "seconds", "ops/agent", "ops_max",
                "bytes/agent", "bytes_max", "wrong", "srv_cpu");
    int wrong = 0;
    const PhaseResult connect = runPhase(children, 'c');
    printRow("connect", connect, connect.errors);
    wrong += connect.errors;

    const PhaseResult round = runPhase(children, 'r');
    const int round_wrong = wrongSeats(round, 0, n) + round.errors;
    printRow("round", round, round_wrong);
    wrong += round_wrong;

    StoreClientOptions reader_options;
    reader_options.port = port;
    reader_options.timeout = std::chrono::seconds(120);
    CountingEnv reader_env("status-reader");
    auto reader = reader_env.connect(reader_options);

    const PhaseResult status = runPhase(children, 's');
    printRow("status", status, status.errors);
    wrong += status.errors;
    const double read_cpu = processCpuSeconds();
    const int64_t read_start = nowNs();
    const int64_t read_bytes_before = reader_env.traffic.bytes;
    const int64_t read_ops_before = reader_env.traffic.ops;
    const JobStatus job = readJobStatus(*reader, "sim");
    const double read_seconds = static_cast<double>(nowNs() - read_start) / 1e9;
    const int status_wrong = static_cast<int>(job.agents.size()) == n && job.nodes_in_round == n ? 0 : 1;
    std::printf("%-8s %7d %9.3f %9lld %8s %11lld %10s %6d %8.3f\n", "status_r", 1, read_seconds,
                static_cast<long long>(reader_env.traffic.ops - read_ops_before), "-",
                static_cast<long long>(reader_env.traffic.bytes - read_bytes_before), "-", status_wrong,
                processCpuSeconds() - read_cpu);
    wrong += status_wrong;

    const PhaseResult hang = runPhase(children, 'h');
    int hang_wrong = hang.errors;
    int judges = 0;
    for (const auto& r : hang.rows) {
      if (r.answers < 0) continue;
      ++judges;
      if (r.answers != n - 1) {
        std::fprintf(stderr, "rdzv_sim: hang: the judge received %d of %d summaries\n", r.answers, n - 1);
        ++hang_wrong;
      }
    }
    if (judges != 1) ++hang_wrong;
    printRow("hang", hang, hang_wrong);
    wrong += hang_wrong;

    const PhaseResult events = runPhase(children, 'e');
    printRow("events", events, events.errors);
    wrong += events.errors;

    const PhaseResult reform = runPhase(children, 'f');
    const int reform_wrong = wrongSeats(reform, 1, n - 1) + reform.errors;
    printRow("reform", reform, reform_wrong);
    wrong += reform_wrong;

    // The exit barrier, timed until the store's host (this process) sees everyone checked out.
    const int64_t exit_start = nowNs();
    PhaseResult exit_phase = runPhase(children, 'x');
    int exit_wrong = exit_phase.errors;
    try {
      reader->wait({"rdzv/sim/r1/all_exited"}, std::chrono::seconds(1));
      if (reader->get("rdzv/sim/r1/end") != RoundEnd::done().format()) ++exit_wrong;
    } catch (const StoreError& e) {
      std::fprintf(stderr, "rdzv_sim: exit: %s\n", e.what());
      ++exit_wrong;
    }
    exit_phase.seconds = std::max(exit_phase.seconds, static_cast<double>(nowNs() - exit_start) / 1e9);
    printRow("exit", exit_phase, exit_wrong);
    wrong += exit_wrong;
    stopChildren(children, false);

    std::printf(
        "# ops/agent, bytes/agent: store operations and payload bytes (keys, values) per agent in the phase; "
        "status_r: `ddprun status` reading all %d records (one reader, in the store's process); srv_cpu: CPU seconds "
        "of the store's process; events: a round's 10 events appended to each agent's own file (bytes/agent: the "
        "file's size, "
        "no store traffic); reform includes last_call_timeout %d s\n",
        n, o.last_call_s);
    std::printf(
        "rdzv_sim participants=%d seconds=%.3f ops_per_agent=%.1f status_seconds=%.3f status_read_seconds=%.3f "
        "hang_seconds=%.3f events_seconds=%.3f events_bytes_per_agent=%.0f reform_seconds=%.3f "
        "reform_ops_per_agent=%.1f "
        "exit_seconds=%.3f exit_ops_per_agent=%.1f wrong=%d\n",
        n, round.seconds, round.ops_mean, status.seconds, read_seconds, hang.seconds, events.seconds, events.bytes_mean,
        reform.seconds, reform.ops_mean, exit_phase.seconds, exit_phase.ops_mean, wrong);
    return wrong == 0 ? 0 : 1;
  } catch (...) {
    stopChildren(children, true);
    throw;
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    }
  }
  try {
    ddprun::configureLogging("rdzv_sim");
    return run(parse(argc, argv));
  } catch (const ddprun::UsageError& e) {
    std::fprintf(stderr, "rdzv_sim: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rdzv_sim: %s\n", e.what());
    return 1;
  }
}
