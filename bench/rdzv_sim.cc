// rdzv_sim: rendezvous at scale, in one process over real loopback sockets.
// N participants (threads, each with its own store connection and its own
// DynamicRendezvous, exactly as an agent uses it) join one c10d round of a job with
// --nnodes=N:N against one store server. Measures the wall time from the first join to
// the last participant holding its result, and checks that every RANK 0..N-1 was
// handed out exactly once with one world size.
//   rdzv_sim [participants=4096]
// Last line: rdzv_sim participants=N seconds=S
#include <pthread.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <vector>

#include "common/env_reader.h"
#include "common/logging.h"
#include "rendezvous/dynamic_rendezvous.h"
#include "rendezvous/store_server.h"

namespace {

using namespace ddprun::rendezvous;
using Clock = std::chrono::steady_clock;

struct Participant {
  RendezvousConfig config;
  std::unique_ptr<DynamicRendezvous> rendezvous;
  RendezvousResult result;
  std::string error;
  std::shared_future<void> go;
};

void* joinRound(void* arg) {
  auto* p = static_cast<Participant*>(arg);
  p->go.wait();
  try {
    p->result = p->rendezvous->nextRound();
  } catch (const std::exception& e) {
    p->error = e.what();
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  ddprun::configureLogging("rdzv_sim");
  const auto n = static_cast<int>(argc > 1 ? ddprun::env::parseInteger("nodes", argv[1], 1, 1 << 20) : 4096);
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = std::max<rlim_t>(files.rlim_cur, std::min<rlim_t>(files.rlim_max, 4 * n + 1024));
  setrlimit(RLIMIT_NOFILE, &files);

  StoreServerOptions server_options;
  server_options.host = "127.0.0.1";
  StoreServer server(server_options);

  // Connecting is setup, not rendezvous: every participant connects first.
  std::vector<Participant> participants(n);
  std::promise<void> start_signal;
  std::shared_future<void> go = start_signal.get_future().share();
  for (auto& p : participants) {
    p.config.backend = "c10d";
    p.config.endpoint = "127.0.0.1:" + std::to_string(server.port());
    p.config.run_id = "sim";
    p.config.min_nodes = p.config.max_nodes = n;
    p.config.conf = {{"is_host", "false"}, {"read_timeout", "120"}, {"join_timeout", "120"}};
    p.rendezvous = std::make_unique<DynamicRendezvous>(p.config, 1);
    p.go = go;
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  std::vector<pthread_t> threads(n);
  for (int i = 0; i < n; ++i) pthread_create(&threads[i], &attr, joinRound, &participants[i]);
  const auto start = Clock::now();
  start_signal.set_value();
  for (auto& t : threads) pthread_join(t, nullptr);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();

  std::vector<int> seen(n, 0);
  int wrong = 0;
  for (const auto& p : participants) {
    if (!p.error.empty()) {
      std::fprintf(stderr, "participant failed: %s\n", p.error.c_str());
      ++wrong;
      continue;
    }
    if (p.result.world_size != n || p.result.group_world_size != n || p.result.rank_base < 0 ||
        p.result.rank_base >= n || seen[p.result.rank_base]++ != 0) {
      ++wrong;
    }
  }
  std::printf("%10s %8s %10s %6s\n", "participants", "rounds", "seconds", "wrong");
  std::printf("%10d %8d %10.3f %6d\n", n, 1, seconds, wrong);
  std::printf("rdzv_sim participants=%d seconds=%.3f\n", n, seconds);
  return wrong == 0 ? 0 : 1;
}
