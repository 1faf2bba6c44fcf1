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
//
// Usage: rdzv_sim [participants=4096] [--procs P] [--last-call S]
// Last line: rdzv_sim participants=N seconds=S ops_per_agent=O status_seconds=... wrong=W
// (seconds: the round's)
// Exit status 0 when every check held, 1 otherwise, 2 for bad arguments.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "agent/ops/event_log.h"
#include "bench/counting_env.h"
#include "common/env_reader.h"
#include "common/error.h"
#include "common/logging.h"
#include "rendezvous/backends.h"
#include "rendezvous/board/job_board.h"
#include "rendezvous/board/job_status.h"
#include "rendezvous/rounds/dynamic_rendezvous.h"
#include "rendezvous/store/store_server.h"

namespace {

using namespace ddprun::rendezvous;
using ddprun::bench::CountingEnv;

constexpr int kNprocPerNode = 8;
constexpr int kAgentsPerProcess = 4096;
// How often an agent looks for another node's hang summary request (rendezvous/PROTOCOL.md).
constexpr auto kHangRequestPoll = std::chrono::seconds(2);
constexpr auto kHangWait = std::chrono::seconds(30);

int64_t nowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

struct Options {
  int participants = 4096;
  int procs = 0;  // 0: one per kAgentsPerProcess agents, at least 2
  int last_call_s = 2;
  std::string events_dir;  // a temporary directory for the agents' events files
};

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

// What a client process reports after each phase: a header, then one row per agent.
struct PhaseHeader {
  int32_t agents = 0;
  int32_t errors = 0;
  int64_t end_ns = 0;  // when its last agent finished the phase
  int64_t ops_sum = 0, ops_max = 0, bytes_sum = 0, bytes_max = 0;
  char first_error[200] = {};
};
struct AgentRow {
  int32_t round = -1, group_rank = -1, rank_base = -1, world_size = 0, group_world_size = 0;
  int32_t answers = -1;  // the judge's hang summaries received; -1 for the others
};

void writeAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(std::string("pipe write: ") + std::strerror(errno));
    p += n;
    size -= static_cast<size_t>(n);
  }
}
bool readAll(int fd, void* data, size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

struct Agent {
  int index = 0;  // 0 .. N-1 over all processes
  std::unique_ptr<CountingEnv> env;
  std::unique_ptr<DynamicRendezvous> rendezvous;
  std::unique_ptr<JobBoard> board;
  std::unique_ptr<ddprun::agent::EventLog> events;
  RendezvousResult result;
  bool gone = false;  // the node that left before the re-form
  int answers = -1;
  std::string error;
  int64_t ops_before = 0, bytes_before = 0, end_ns = 0;
  int64_t event_bytes = 0;  // what its events file holds after the events phase
};

// One client process: its agents, one phase per command byte from the parent.
class ClientProcess {
 public:
  ClientProcess(const Options& o, int first, int count, int port)
      : o_(o), port_(port), agents_(static_cast<size_t>(count)) {
    for (int i = 0; i < count; ++i) agents_[static_cast<size_t>(i)].index = first + i;
  }

  void serve(int commands, int reports) {
    char phase = 0;
    while (readAll(commands, &phase, 1) && phase != 'q') {
      run(phase);
      report(reports);
    }
  }

 private:
  RendezvousConfig config() const {
    RendezvousConfig c;
    c.backend = "c10d";
    c.endpoint = "127.0.0.1:" + std::to_string(port_);
    c.run_id = "sim";
    c.min_nodes = o_.participants - 1;
    c.max_nodes = o_.participants;
    c.conf = {{"is_host", "false"},
              {"read_timeout", "120"},
              {"join_timeout", "120"},
              {"close_timeout", "120"},
              {"last_call_timeout", std::to_string(o_.last_call_s)}};
    return c;
  }

  void phaseOf(Agent& a, char phase) {
    const int n = o_.participants;
    if (phase != 'c' && !a.rendezvous) throw std::runtime_error("not connected to the store");
    if (phase == 'h' && !a.board) throw std::runtime_error("no job board (its status phase failed)");
    switch (phase) {
      case 'c':  // connect: setup, not timed as a phase of the job
        a.env = std::make_unique<CountingEnv>("sim-node-" + std::to_string(a.index));
        a.rendezvous = openRendezvous(config(), kNprocPerNode, *a.env);
        break;
      case 'r': a.result = a.rendezvous->nextRound(); break;
      case 's': {
        a.board = std::make_unique<JobBoard>(*a.rendezvous);
        AgentRecord r;
        r.state = "running";
        r.round = a.result.round;
        r.group_rank = a.result.group_rank;
        r.rank_base = a.result.rank_base;
        r.nproc = kNprocPerNode;
        r.max_restarts = 3;
        a.board->publishStatus(r);
        a.board->publishStatus(r);  // a refresh, as at each keep-alive
        break;
      }
      case 'h': {
        if (a.result.group_rank == 0) {
          a.answers = static_cast<int>(a.board->gatherHangSummaries(kHangWait).size());
          break;
        }
        const auto deadline = std::chrono::steady_clock::now() + kHangWait;
        // Agents look at their own pace: spread the first look over the poll interval.
        std::this_thread::sleep_for(kHangRequestPoll * a.index / n);
        while (!a.board->hangSummaryRequested()) {
          if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("no hang summary request seen");
          std::this_thread::sleep_for(kHangRequestPoll);
        }
        std::string summary;
        for (int r = 0; r < kNprocPerNode; ++r) {
          summary += "rank=" + std::to_string(a.result.rank_base + r) +
                     " seq=18231 op=allreduce state=completed bytes=4194304 age_ms=61234 pg=0 stream=7\n";
        }
        a.board->publishHangSummary(summary);
        break;
      }
      case 'e': {
        // A round's events, as the agent writes them (agent/job_reporter.cc): no store traffic,
        // one local file per agent (its run directory's events.jsonl).
        a.events = std::make_unique<ddprun::agent::EventLog>(
            std::vector<std::string>{o_.events_dir + "/" + std::to_string(a.index) + ".jsonl"}, "sim");
        a.events->setNode(a.env->nodeName());
        const auto& r = a.result;
        a.events->emit("rendezvous_round", ddprun::JsonObject()
                                               .add("round", r.round)
                                               .add("group_rank", r.group_rank)
                                               .add("nodes", r.group_world_size)
                                               .add("world_size", r.world_size)
                                               .add("first_rank", r.rank_base)
                                               .add("last_rank", r.rank_base + kNprocPerNode - 1)
                                               .add("restart_count", r.restart_count)
                                               .add("master", r.master_addr + ":" + std::to_string(r.master_port)));
        for (int w = 0; w < kNprocPerNode; ++w) {
          a.events->emit("worker_start", ddprun::JsonObject()
                                             .add("rank", r.rank_base + w)
                                             .add("local_rank", w)
                                             .add("pid", 100000 + w)
                                             .add("attempt", 0));
        }
        a.events->emit("round_end",
                       ddprun::JsonObject().add("round", r.round).add("reason", "done").add("cause", "done"));
        a.event_bytes =
            static_cast<int64_t>(std::filesystem::file_size(o_.events_dir + "/" + std::to_string(a.index) + ".jsonl"));
        break;
      }
      case 'f':
        if (a.index == n - 1) {
          a.rendezvous->endRound(RoundEnd::evict(a.env->nodeName()));
          a.gone = true;
        } else {
          a.result = a.rendezvous->nextRound();
        }
        break;
      case 'x':
        if (a.gone) break;
        a.rendezvous->markDone();
        a.rendezvous->finish();
        break;
      default: throw std::runtime_error(std::string("unknown phase '") + phase + "'");
    }
  }

  // One thread per agent for the whole run, parked between phases: creating 16,384 threads is
  // the simulation's cost, not the job's, and stays out of every phase's time.
  static void* agentThread(void* arg) {
    auto* job = static_cast<std::pair<ClientProcess*, Agent*>*>(arg);
    ClientProcess& self = *job->first;
    int seen = 0;
    for (;;) {
      char phase = 0;
      {
        std::unique_lock lock(self.mutex_);
        self.phase_started_.wait(lock, [&] { return self.generation_ != seen; });
        seen = self.generation_;
        phase = self.phase_;
      }
      if (phase == 'q') return nullptr;
      runAgent(self, *job->second, phase);
      std::lock_guard lock(self.mutex_);
      if (--self.running_ == 0) self.phase_done_.notify_one();
    }
  }

  static void runAgent(ClientProcess& self, Agent& a, char phase) {
    if (!a.gone) {
      try {
        self.phaseOf(a, phase);
      } catch (const std::exception& e) {
        a.error = e.what();
      }
    }
    a.end_ns = nowNs();
  }

  void run(char phase) {
    phase_ = phase;
    for (auto& a : agents_) {
      a.error.clear();
      a.answers = -1;
      if (a.env) {
        a.ops_before = a.env->traffic.ops;
        a.bytes_before = a.env->traffic.bytes;
      }
    }
    if (phase == 'c') {
      for (auto& a : agents_) runAgent(*this, a, phase);
      startThreads();
      return;
    }
    std::unique_lock lock(mutex_);
    running_ = static_cast<int>(threads_.size());
    ++generation_;
    phase_started_.notify_all();
    phase_done_.wait(lock, [&] { return running_ == 0; });
  }

  void startThreads() {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    jobs_.reserve(agents_.size());
    for (auto& a : agents_) {
      jobs_.emplace_back(this, &a);
      pthread_t t;
      if (pthread_create(&t, &attr, agentThread, &jobs_.back()) != 0) {
        pthread_attr_destroy(&attr);
        throw std::runtime_error("pthread_create: cannot start a thread per agent");
      }
      threads_.push_back(t);
    }
    pthread_attr_destroy(&attr);
  }

 public:
  ~ClientProcess() {
    {
      std::lock_guard lock(mutex_);
      phase_ = 'q';
      ++generation_;
      phase_started_.notify_all();
    }
    for (auto t : threads_) pthread_join(t, nullptr);
  }

 private:
  void report(int fd) {
    PhaseHeader h;
    std::vector<AgentRow> rows;
    for (const auto& a : agents_) {
      if (a.gone && phase_ != 'f') continue;
      ++h.agents;
      if (!a.error.empty() && h.errors++ == 0) {
        std::snprintf(h.first_error, sizeof h.first_error, "agent %d: %s", a.index, a.error.c_str());
      }
      h.end_ns = std::max(h.end_ns, a.end_ns);
      const int64_t ops = a.env ? a.env->traffic.ops - a.ops_before : 0;
      const int64_t bytes = phase_ == 'e' ? a.event_bytes : a.env ? a.env->traffic.bytes - a.bytes_before : 0;
      h.ops_sum += ops;
      h.bytes_sum += bytes;
      h.ops_max = std::max(h.ops_max, ops);
      h.bytes_max = std::max(h.bytes_max, bytes);
      AgentRow r;
      r.round = a.gone ? -1 : a.result.round;
      r.group_rank = a.gone ? -1 : a.result.group_rank;
      r.rank_base = a.gone ? -1 : a.result.rank_base;
      r.world_size = a.result.world_size;
      r.group_world_size = a.result.group_world_size;
      r.answers = a.answers;
      rows.push_back(r);
    }
    writeAll(fd, &h, sizeof h);
    writeAll(fd, rows.data(), rows.size() * sizeof(AgentRow));
  }

  const Options& o_;
  int port_;
  std::vector<Agent> agents_;
  std::vector<std::pair<ClientProcess*, Agent*>> jobs_;
  std::vector<pthread_t> threads_;
  std::mutex mutex_;
  std::condition_variable phase_started_, phase_done_;
  int generation_ = 0;
  int running_ = 0;
  char phase_ = 0;
};

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
          ClientProcess client(o, first, c.agents, port);
          client.serve(commands[0], reports[1]);
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
