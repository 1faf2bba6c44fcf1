#include "agent/agent_env.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <memory>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include "agent/process/adopted_children.h"
#include "agent/process/process_signals.h"
#include "agent/process/process_state.h"
#include "rendezvous/store/tcp_store_client.h"

namespace ddprun::agent {
namespace {

class RealAgentEnv final : public AgentEnv {
 public:
  RealAgentEnv() {
    // A worker's closed pipe is an error to handle where it happens, not a reason to die.
    ::signal(SIGPIPE, SIG_IGN);
    // Orphaned grandchildren of workers come to us, so we can reap and account for them.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  }
  boost::asio::io_context& io() override { return io_; }
  Clock& clock() override { return Clock::real(); }

  void runFor(Clock::Duration limit) override {
    if (io_.stopped()) io_.restart();
    // Asio's run_one_for runs nothing at all when the limit is not positive; a round loop whose
    // next look is already due (one that blocked past it) would then never run a handler: no
    // child reaped, no signal or round event seen (an agent wedged for good in the chaos soak).
    if (limit <= Clock::Duration::zero()) {
      io_.poll();
      return;
    }
    io_.run_one_for(limit);
  }

  void onSignals(const std::vector<int>& signals, std::function<void(int)> handler) override {
    auto set = std::make_unique<boost::asio::signal_set>(io_);
    for (int sig : signals) set->add(sig);
    arm(*set, std::make_shared<std::function<void(int)>>(std::move(handler)));
    signal_sets_.push_back(std::move(set));
  }

  SpawnedProcess spawn(const SpawnRequest& request) override { return spawnWorker(request); }
  int signalProcess(pid_t pid, int signal) override { return agent::signalProcess(pid, signal); }
  int signalGroup(pid_t pgid, int signal) override { return agent::signalGroup(pgid, signal); }

  std::optional<ReapedChild> reap() override {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return std::nullopt;
    return ReapedChild{pid, status};
  }

  std::string processState(pid_t pid) override { return describeProcessState(pid); }
  std::vector<pid_t> adoptedChildren(const std::vector<pid_t>& ours) override { return liveChildren(ours); }

  std::unique_ptr<rendezvous::Store> connectStore(const std::string& host, int port,
                                                  std::chrono::milliseconds timeout) override {
    rendezvous::StoreClientOptions options;
    options.host = host;
    options.port = port;
    options.timeout = timeout;
    options.connect_timeout = timeout;
    options.first_answer_timeout = timeout;
    return std::make_unique<rendezvous::TcpStoreClient>(options);
  }

  std::vector<HungStop> stopHung(const std::vector<HungWorker>& workers, int signal, const std::string& reason,
                                 std::chrono::milliseconds kill_after) override {
    return hung_stopper_.stop(workers, signal, reason, kill_after);
  }
  void cancelHungStops() override { hung_stopper_.cancel(); }

 private:
  // Re-armed after each signal; the handler is shared, as each wait takes its own copy.
  static void arm(boost::asio::signal_set& set, std::shared_ptr<std::function<void(int)>> handler) {
    set.async_wait([&set, handler](const boost::system::error_code& ec, int signal) {
      if (ec) return;
      (*handler)(signal);
      arm(set, handler);
    });
  }

  // The signal sets before the stopper, and both after the loop: destroyed first, they
  // cancel their waits while the io_context still lives.
  boost::asio::io_context io_;
  HungWorkerStopper hung_stopper_{io_};
  std::vector<std::unique_ptr<boost::asio::signal_set>> signal_sets_;
};

}  // namespace

std::unique_ptr<AgentEnv> AgentEnv::real() { return std::make_unique<RealAgentEnv>(); }

}  // namespace ddprun::agent
