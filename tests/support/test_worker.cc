// A worker for end-to-end tests of ddprun. Each mode is one behaviour a test needs to
// observe from the outside (env contract, exits, signals, output, grandchildren).
//   env                          print the contract variables, one NAME=value per line
//   exit CODE                    exit with CODE
//   fail-attempts N [CODE]       exit CODE (default 1) while TORCHELASTIC_RESTART_COUNT < N, else 0
//   fail-rank R CODE [DELAY_MS]  rank R exits CODE after DELAY_MS; other ranks wait to be stopped
//   raise SIGNUM                 kill itself with SIGNUM
//   throw MESSAGE                throw std::runtime_error(MESSAGE) through recordErrors
//   wait DIR                     print "ready", then wait; SIGUSR1/2 -> touch DIR/usr1.<rank>;
//                                SIGTERM/INT/HUP/QUIT -> touch DIR/<sig>.<rank> and exit 0
//   grandchild FILE              fork a child that sleeps forever; append both pids to FILE;
//                                print "ready"; sleep forever
//   lines N                      print N numbered lines to stdout and stderr, partly in pieces
//   ignore-term                  ignore SIGTERM, print "ready", sleep forever
//   timer SCOPE AFTER_MS HOLD_MS RANK ATTEMPTS
//                                set file timer SCOPE (ddprun::runtime::expires) to AFTER_MS; rank RANK
//                                holds it HOLD_MS (in sleepInTimedScope) while TORCHELASTIC_RESTART_COUNT <
//                                ATTEMPTS, the others 10 ms; print "released rank=R" and exit 0
//   stop-self                    print "ready pid=PID", then SIGSTOP itself (and pause if continued)
//   collectives STEPS STEP_MS SLOW_RANK SLOW_AT SLOW_MS ATTEMPTS [sleep|broadcast [TIMEOUT_MS]]
//                                STEPS all_reduces of 1024 float32 on a host backend (checked), each after
//                                STEP_MS of "compute"; while TORCHELASTIC_RESTART_COUNT < ATTEMPTS rank
//                                SLOW_RANK first sleeps SLOW_MS (in sleepBeforeCollective) before all_reduce
//                                #SLOW_AT (0: before every one), or with `broadcast` calls broadcast from
//                                rank 0 there instead; the group's timeout is TIMEOUT_MS (default 60000);
//                                prints "step I rank=R", then "done rank=R"
//   isolation TOKEN PIDFILE STEPS
//                                append its pid to PIDFILE; claim the workers' store for TOKEN (compare-set of
//                                "isolation/job"): another job's token there is an error; then STEPS checked
//                                all_reduces of 1024 float32 on a host backend; prints "isolated rank=R"
//   p2p-recv ATTEMPTS [TIMEOUT_MS]
//                                on a host backend (group timeout TIMEOUT_MS, default 60000): all_reduce #1,
//                                then rank 0 receives 16 float32 from rank 1, which first sleeps 10 min (in
//                                sleepInsteadOfSend) while TORCHELASTIC_RESTART_COUNT < ATTEMPTS; then
//                                all_reduce #2; prints "done rank=R"
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/env_names.h"
#include "common/env_reader.h"
#include "rendezvous/store/tcp_store_client.h"
#include "worker_runtime/backend/host_backend.h"
#include "worker_runtime/env_contract.h"
#include "worker_runtime/error_record.h"
#include "worker_runtime/scoped_timer.h"

namespace {

volatile sig_atomic_t g_last_signal = 0;

void onSignal(int sig) { g_last_signal = sig; }

void touch(const std::string& path) { std::ofstream(path) << "x"; }

int rankFromEnv() { return ddprun::env::integerOr<int>("RANK", -1, 0, INT32_MAX); }

int modeEnv() {
  const char* names[] = {ddprun::env::kRank,
                         ddprun::env::kLocalRank,
                         ddprun::env::kWorldSize,
                         ddprun::env::kLocalWorldSize,
                         ddprun::env::kGroupRank,
                         ddprun::env::kGroupWorldSize,
                         ddprun::env::kRoleRank,
                         ddprun::env::kRoleWorldSize,
                         ddprun::env::kRoleName,
                         ddprun::env::kMasterAddr,
                         ddprun::env::kMasterPort,
                         ddprun::env::kRestartCount,
                         ddprun::env::kMaxRestarts,
                         ddprun::env::kRunId,
                         ddprun::env::kUseAgentStore,
                         ddprun::env::kErrorFile,
                         ddprun::env::kTorchNcclAsyncErrorHandling,
                         ddprun::env::kOmpNumThreads};
  std::string out;
  for (const char* name : names) {
    const char* value = std::getenv(name);
    out += std::string("R") + std::to_string(rankFromEnv()) + " " + name + "=" + (value ? value : "<unset>") + "\n";
  }
  // Parse through the runtime too: a malformed contract fails here.
  ddprun::runtime::WorkerEnv::fromEnvironment();
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

int modeWait(const std::string& dir) {
  // Signals stay blocked except inside sigsuspend, so none can slip in between the
  // check and the wait.
  sigset_t handled, previous;
  sigemptyset(&handled);
  for (int sig : {SIGUSR1, SIGUSR2, SIGTERM, SIGINT, SIGHUP, SIGQUIT}) {
    ::signal(sig, onSignal);
    sigaddset(&handled, sig);
  }
  ::sigprocmask(SIG_BLOCK, &handled, &previous);
  std::printf("ready rank=%d\n", rankFromEnv());
  std::fflush(stdout);
  for (;;) {
    ::sigsuspend(&previous);
    int sig = g_last_signal;
    g_last_signal = 0;
    if (sig == 0) continue;
    std::string name = sigabbrev_np(sig);
    for (auto& c : name) c = static_cast<char>(std::tolower(c));
    touch(dir + "/" + name + "." + std::to_string(rankFromEnv()));
    if (sig != SIGUSR1 && sig != SIGUSR2) return 0;
  }
}

int modeGrandchild(const std::string& file) {
  pid_t child = ::fork();
  if (child == 0) {
    for (;;) ::pause();
  }
  std::ofstream(file, std::ios::app) << ::getpid() << "\n" << child << "\n";
  std::printf("ready rank=%d\n", rankFromEnv());
  std::fflush(stdout);
  for (;;) ::pause();
}

int modeLines(int n) {
  for (int i = 0; i < n; ++i) {
    // Written in two pieces to check that the agent joins partial writes into one line.
    std::string head = "rank " + std::to_string(rankFromEnv()) + " line " + std::to_string(i);
    std::string tail = " " + std::string(200, static_cast<char>('a' + i % 26)) + " end\n";
    ::write(1, head.data(), head.size());
    ::write(1, tail.data(), tail.size());
    std::string err = "rank " + std::to_string(rankFromEnv()) + " err " + std::to_string(i) + "\n";
    ::write(2, err.data(), err.size());
  }
  return 0;
}

}  // namespace

// Outside the anonymous namespace and never inlined: the stacks ddprun takes show it by name.
__attribute__((noinline)) void sleepInTimedScope(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  asm volatile("");  // keeps the call from becoming a tail call, so this frame stays on the stack
}

__attribute__((noinline)) void sleepBeforeCollective(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  asm volatile("");
}

__attribute__((noinline)) void sleepInsteadOfSend(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  asm volatile("");
}

namespace {

std::unique_ptr<ddprun::rendezvous::TcpStoreClient> connectToAgentStore(const ddprun::runtime::StoreEnv& e) {
  ddprun::rendezvous::StoreClientOptions options;
  options.host = e.master_addr;
  options.port = e.master_port;
  options.timeout = std::chrono::seconds(60);
  options.connect_timeout = std::chrono::seconds(60);
  return std::make_unique<ddprun::rendezvous::TcpStoreClient>(options);
}

int modeP2PRecv(int attempts, int timeout_ms, int attempt) {
  using namespace ddprun::runtime;
  const auto e = StoreEnv::fromEnvironment();
  if (e.world_size < 2) throw std::invalid_argument("p2p-recv needs 2 ranks or more");
  auto store = connectToAgentStore(e);
  HostBackend backend(*store, "test/p2p/" + std::to_string(attempt) + "/", e.rank, e.world_size, store->localAddress(),
                      std::chrono::milliseconds(timeout_ms));
  std::vector<float> buf(16, 1.0f);
  auto allReduceOnce = [&] {
    backend
        .enqueue(
            [&](CollectiveContext& ctx) { allReduce(ctx, buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum); },
            {ddprun::FlightOp::kAllReduce, ddprun::FlightDType::kFloat32, buf.size(), -1})
        ->wait();
  };
  allReduceOnce();
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  if (e.rank == 0) {
    std::vector<float> got(16, 0.0f);
    backend.p2p().recv(1, 5, got.data(), got.size() * 4, deadline, {}, ddprun::FlightDType::kFloat32)->wait();
    if (got[15] != 7.0f) throw std::runtime_error("recv from rank 1 gave " + std::to_string(got[15]));
  } else if (e.rank == 1) {
    if (attempt < attempts) sleepInsteadOfSend(600000);
    std::vector<float> out(16, 7.0f);
    backend.p2p().send(0, 5, out.data(), out.size() * 4, deadline, {}, ddprun::FlightDType::kFloat32)->wait();
  }
  allReduceOnce();
  std::printf("done rank=%d\n", e.rank);
  std::fflush(stdout);
  return 0;
}

int modeCollectives(int steps, int step_ms, int slow_rank, int slow_at, int slow_ms, int attempts, bool broadcast,
                    int timeout_ms, int attempt) {
  using namespace ddprun::runtime;
  const auto e = StoreEnv::fromEnvironment();
  auto store = connectToAgentStore(e);
  HostBackend backend(*store, "test/collectives/" + std::to_string(attempt) + "/", e.rank, e.world_size,
                      store->localAddress(), std::chrono::milliseconds(timeout_ms));
  std::vector<float> buf(1024);
  const ddprun::FlightOpInfo all_reduce{ddprun::FlightOp::kAllReduce, ddprun::FlightDType::kFloat32, buf.size(), -1};
  for (int step = 1; step <= steps; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    std::fill(buf.begin(), buf.end(), 1.0f);
    const bool slow = e.rank == slow_rank && attempt < attempts && (slow_at == 0 || step == slow_at);
    if (slow && broadcast) {
      backend
          .enqueue([&](CollectiveContext& ctx) { ddprun::runtime::broadcast(ctx, buf.data(), buf.size() * 4, 0); },
                   {ddprun::FlightOp::kBroadcast, ddprun::FlightDType::kFloat32, buf.size(), 0})
          ->wait();
    } else {
      if (slow) sleepBeforeCollective(slow_ms);
      backend
          .enqueue(
              [&](CollectiveContext& ctx) { allReduce(ctx, buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum); },
              all_reduce)
          ->wait();
      if (buf[0] != static_cast<float>(e.world_size)) {
        throw std::runtime_error("all_reduce #" + std::to_string(step) + " gave " + std::to_string(buf[0]));
      }
    }
    std::printf("step %d rank=%d\n", step, e.rank);
    std::fflush(stdout);
  }
  std::printf("done rank=%d\n", e.rank);
  return 0;
}

// Many jobs on one machine: a worker that reached another job's store (a port taken twice) or
// shared another job's segments would see a foreign token or a wrong sum.
int modeIsolation(const std::string& token, const std::string& pid_file, int steps) {
  using namespace ddprun::runtime;
  std::ofstream(pid_file, std::ios::app) << ::getpid() << "\n";
  const auto e = StoreEnv::fromEnvironment();
  auto store = connectToAgentStore(e);
  const std::string owner = store->compareSet("isolation/job", "", token);
  if (owner != token) throw std::runtime_error("the workers' store belongs to job " + owner + ", not " + token);
  HostBackend backend(*store, "test/isolation/", e.rank, e.world_size, store->localAddress(),
                      std::chrono::milliseconds(60000));
  std::vector<float> buf(1024);
  for (int step = 1; step <= steps; ++step) {
    std::fill(buf.begin(), buf.end(), static_cast<float>(e.rank + step));
    backend
        .enqueue(
            [&](CollectiveContext& ctx) { allReduce(ctx, buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum); },
            {ddprun::FlightOp::kAllReduce, ddprun::FlightDType::kFloat32, buf.size(), -1})
        ->wait();
    const float want = static_cast<float>(e.world_size * (e.world_size - 1) / 2 + e.world_size * step);
    if (buf[1023] != want) {
      throw std::runtime_error("all_reduce #" + std::to_string(step) + " gave " + std::to_string(buf[1023]) + ", not " +
                               std::to_string(want));
    }
  }
  std::printf("isolated rank=%d\n", e.rank);
  return 0;
}

int modeTimer(const std::string& scope, int after_ms, int hold_ms, int hang_rank, int hang_attempts, int attempt) {
  auto timer = ddprun::runtime::expires(std::chrono::milliseconds(after_ms), scope);
  std::printf("timer set rank=%d armed=%d\n", rankFromEnv(), timer.armed() ? 1 : 0);
  std::fflush(stdout);
  sleepInTimedScope(rankFromEnv() == hang_rank && attempt < hang_attempts ? hold_ms : 10);
  timer.release();
  std::printf("released rank=%d\n", rankFromEnv());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::runtime::recordErrors([&]() -> int {
    if (argc < 2) throw std::invalid_argument("usage: ddprun_test_worker MODE [ARGS]");
    std::string mode = argv[1];
    auto arg = [&](int i) -> std::string {
      if (argc <= i) throw std::invalid_argument("mode " + mode + " needs more arguments");
      return argv[i];
    };
    const int attempt = ddprun::env::integerOr<int>("TORCHELASTIC_RESTART_COUNT", 0, 0, INT32_MAX);
    if (mode == "env") return modeEnv();
    if (mode == "exit") return std::stoi(arg(2));
    if (mode == "fail-attempts") return attempt < std::stoi(arg(2)) ? (argc > 3 ? std::stoi(arg(3)) : 1) : 0;
    if (mode == "fail-rank") {
      if (rankFromEnv() == std::stoi(arg(2))) {
        std::this_thread::sleep_for(std::chrono::milliseconds(argc > 4 ? std::stoi(arg(4)) : 0));
        return std::stoi(arg(3));
      }
      for (;;) ::pause();
    }
    if (mode == "raise") {
      ::raise(std::stoi(arg(2)));
      return 0;
    }
    if (mode == "throw") throw std::runtime_error(arg(2));
    if (mode == "wait") return modeWait(arg(2));
    if (mode == "grandchild") return modeGrandchild(arg(2));
    if (mode == "lines") return modeLines(std::stoi(arg(2)));
    if (mode == "timer") {
      return modeTimer(arg(2), std::stoi(arg(3)), std::stoi(arg(4)), std::stoi(arg(5)), std::stoi(arg(6)), attempt);
    }
    if (mode == "collectives") {
      return modeCollectives(std::stoi(arg(2)), std::stoi(arg(3)), std::stoi(arg(4)), std::stoi(arg(5)),
                             std::stoi(arg(6)), std::stoi(arg(7)), argc > 8 && std::string(argv[8]) == "broadcast",
                             argc > 9 ? std::stoi(arg(9)) : 60000, attempt);
    }
    if (mode == "isolation") return modeIsolation(arg(2), arg(3), std::stoi(arg(4)));
    if (mode == "p2p-recv") return modeP2PRecv(std::stoi(arg(2)), argc > 3 ? std::stoi(arg(3)) : 60000, attempt);
    if (mode == "stop-self") {
      std::printf("ready pid=%d\n", static_cast<int>(::getpid()));
      std::fflush(stdout);
      ::raise(SIGSTOP);
      for (;;) ::pause();
    }
    if (mode == "ignore-term") {
      ::signal(SIGTERM, SIG_IGN);
      std::printf("ready rank=%d\n", rankFromEnv());
      std::fflush(stdout);
      for (;;) ::pause();
    }
    throw std::invalid_argument("unknown mode " + mode);
  });
}
