#include "rendezvous/job_board.h"

#include <algorithm>
#include <mutex>
#include <optional>

#include "common/logging.h"
#include "rendezvous/rendezvous_env.h"

namespace ddprun::rendezvous {
namespace {

using std::chrono::milliseconds;

// The most one node's hang summary may hold (agent/hang/hang_verdict.h: a few thousand positions
// of about a hundred bytes; agent/hang/torch_trace/dump_summary.h: torch's dumps and tracebacks, at most 544 KiB).
constexpr size_t kMaxHangSummaryBytes = 1 << 20;

}  // namespace

class JobBoard::Impl {
 public:
  explicit Impl(DynamicRendezvous& rendezvous)
      : rendezvous_(rendezvous), site_(rendezvous.site()), clock_(site_.env->clock()), log_(logger("rendezvous")) {}

  void publishStatus(const AgentRecord& record);
  void refreshHeartbeat();
  std::vector<std::string> gatherHangSummaries(milliseconds wait, const std::string& mine);
  bool hangSummaryRequested();
  void publishHangSummary(const std::string& summary);
  DynamicRendezvous& rendezvous() { return rendezvous_; }

 private:
  std::string roundKey(int round, const std::string& name) const {
    return site_.prefix + "r" + std::to_string(round) + "/" + name;
  }
  // The board's connection, opened when first needed (and again after a store error).
  // Called with mutex_ held.
  StoreClient& store() {
    if (!client_) client_ = site_.env->connect(site_.store);
    return *client_;
  }

  DynamicRendezvous& rendezvous_;
  const JobSite site_;
  Clock& clock_;
  std::shared_ptr<spdlog::logger> log_;

  // Held across each use of the connection: the watcher's refresh must not overwrite a
  // newer record with an older one.
  std::mutex mutex_;
  std::unique_ptr<StoreClient> client_;
  std::optional<AgentRecord> status_;  // the record last published, for the refreshes
  bool registered_ = false;            // this node's name is in the job's agents list
  int hang_answered_round_ = -1;       // the round whose hang summary request this node answered
};

void JobBoard::Impl::publishStatus(const AgentRecord& record) {
  AgentRecord r = record;
  r.node = site_.node;
  r.address = site_.address;
  r.keep_alive_ms = site_.keep_alive_interval.count();
  r.keep_alive_max_attempt = site_.keep_alive_max_attempt;
  r.heartbeat_ms = wallClockMillis();
  std::lock_guard lock(mutex_);
  status_ = r;
  try {
    // The record first: a reader that finds the name in the list can GET it at once.
    store().set(site_.prefix + agentRecordKey(site_.node), encodeAgentRecord(r));
    if (!registered_) {
      store().append(site_.prefix + agentsListKey(), site_.node + "\n");
      registered_ = true;
    }
  } catch (const StoreError& e) {
    client_.reset();
    log_->debug("cannot publish this node's status ({}): {}", r.state, e.what());
  }
}

// On the rendezvous' watcher thread. When the board is busy (a record being published, a
// hang verdict gathering answers), this refresh is left out rather than waited for: the
// watcher's own keep-alive must not wait behind the board.
void JobBoard::Impl::refreshHeartbeat() {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || !status_) return;
  status_->heartbeat_ms = wallClockMillis();
  try {
    store().set(site_.prefix + agentRecordKey(site_.node), encodeAgentRecord(*status_));
  } catch (const StoreError& e) {
    client_.reset();
    log_->debug("cannot refresh this node's status heartbeat: {}", e.what());
  }
}

std::vector<std::string> JobBoard::Impl::gatherHangSummaries(milliseconds wait, const std::string& mine) {
  std::vector<std::string> answers;
  const auto place = rendezvous_.currentRound();
  if (!place || place->participants < 2) return answers;
  std::lock_guard lock(mutex_);
  hang_answered_round_ = place->round;  // this node answers for itself
  std::vector<std::string> keys;
  for (int g = 0; g < place->participants; ++g) {
    if (g != place->group_rank) keys.push_back(roundKey(place->round, "hang/" + std::to_string(g)));
  }
  try {
    // Its own first: a node that asks in the same round reads it, as it reads any answer.
    store().set(roundKey(place->round, "hang/" + std::to_string(place->group_rank)), mine);
    store().set(roundKey(place->round, "hang/request"), site_.node);
    const auto deadline = clock_.now() + wait;
    std::vector<bool> got(keys.size(), false);
    for (;;) {
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!got[i] && store().check({keys[i]})) {
          std::string answer = store().get(keys[i]);
          got[i] = true;
          if (answer.size() > kMaxHangSummaryBytes) {
            log_->warn(
                "hang summary {} of round {} holds {} bytes, more than a node's summary can (at most {}); "
                "ignored",
                keys[i], place->round, answer.size(), kMaxHangSummaryBytes);
            continue;
          }
          answers.push_back(std::move(answer));
        }
      }
      if (std::count(got.begin(), got.end(), true) == static_cast<std::ptrdiff_t>(keys.size()) ||
          clock_.now() >= deadline) {
        break;
      }
      clock_.sleepFor(std::min<Clock::Duration>(milliseconds(100), deadline - clock_.now()));
    }
  } catch (const StoreError& e) {
    client_.reset();
    log_->warn("hang summaries of round {}: {}; judging with {} of {} other nodes", place->round, e.what(),
               answers.size(), keys.size());
  }
  return answers;
}

bool JobBoard::Impl::hangSummaryRequested() {
  const auto place = rendezvous_.currentRound();
  if (!place || place->participants < 2 || hang_answered_round_ == place->round) return false;
  std::lock_guard lock(mutex_);
  try {
    return store().check({roundKey(place->round, "hang/request")});
  } catch (const StoreError& e) {
    client_.reset();
    log_->debug("cannot check for a hang summary request: {}", e.what());
    return false;
  }
}

void JobBoard::Impl::publishHangSummary(const std::string& summary) {
  const auto place = rendezvous_.currentRound();
  if (!place) return;
  std::lock_guard lock(mutex_);
  hang_answered_round_ = place->round;
  try {
    store().set(roundKey(place->round, "hang/" + std::to_string(place->group_rank)), summary);
  } catch (const StoreError& e) {
    client_.reset();
    log_->warn("cannot publish this node's hang summary: {}", e.what());
  }
}

JobBoard::JobBoard(DynamicRendezvous& rendezvous) : impl_(std::make_unique<Impl>(rendezvous)) {
  rendezvous.onKeepAlive([impl = impl_.get()] { impl->refreshHeartbeat(); });
}

JobBoard::~JobBoard() {
  // Returns once no refresh runs on the watcher's thread: then impl_ may go.
  impl_->rendezvous().onKeepAlive({});
}

void JobBoard::publishStatus(const AgentRecord& record) { impl_->publishStatus(record); }
std::vector<std::string> JobBoard::gatherHangSummaries(milliseconds wait, const std::string& mine) {
  return impl_->gatherHangSummaries(wait, mine);
}
bool JobBoard::hangSummaryRequested() { return impl_->hangSummaryRequested(); }
void JobBoard::publishHangSummary(const std::string& summary) { impl_->publishHangSummary(summary); }

}  // namespace ddprun::rendezvous
