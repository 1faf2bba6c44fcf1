#include "bench/rdzv_sim_agents.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agent/ops/event_log.h"
#include "bench/counting_env.h"
#include "rendezvous/backends.h"
#include "rendezvous/board/job_board.h"
#include "rendezvous/board/job_status.h"
#include "rendezvous/rounds/dynamic_rendezvous.h"

namespace ddprun::bench::rdzv_sim {
namespace {

using namespace ddprun::rendezvous;
using ddprun::bench::CountingEnv;

// How often an agent looks for another node's hang summary request (rendezvous/PROTOCOL.md).
constexpr auto kHangRequestPoll = std::chrono::seconds(2);
constexpr auto kHangWait = std::chrono::seconds(30);

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

}  // namespace

int64_t nowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

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

void serveAgents(const Options& o, int first, int count, int port, int commands, int reports) {
  ClientProcess client(o, first, count, port);
  client.serve(commands, reports);
}

}  // namespace ddprun::bench::rdzv_sim
