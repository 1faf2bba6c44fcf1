#include "agent/in_job_recovery.h"

#include <dirent.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/error.h"
#include "common/recovery_keys.h"
#include "common/text_escape.h"

namespace ddprun::agent {

InJobRecovery::InJobRecovery(const AgentConfig& config, AgentEnv& env, WorkerGroup& group, JobReporter& reporter,
                             Containment& containment)
    : config_(config),
      env_(env),
      group_(group),
      reporter_(reporter),
      containment_(containment),
      log_(logger("agent")) {}

InJobRecovery::~InJobRecovery() = default;

void InJobRecovery::setUp(AgentRendezvous& rdzv, std::string flight_dir) {
  rendezvous_ = &rdzv;
  flight_dir_ = std::move(flight_dir);
}

void InJobRecovery::roundStarted(const rendezvous::RendezvousResult& rdzv) {
  round_ = rdzv;
  scope_ = recovery::roundScope(rdzv.restart_count);
  workers_store_.reset();
  look_store_.reset();
  // The workers need a moment to join their group and say so.
  next_spare_look_ = env_.clock().now() + kSpareLookInterval;
  spare_given_up_ = false;
}

bool InJobRecovery::spareWanted() const {
  if (config_.recovery != Recovery::kInJob || !config_.recovery_spare || !round_ || spare_given_up_) return false;
  // --numa-binding binds each worker before exec; a spare is bound to no rank's CPUs yet.
  if (!config_.cpu_bindings.empty() || group_.stopping() || group_.sparePid() > 0 || group_.workers().empty()) {
    return false;
  }
  for (const Worker& w : group_.workers()) {
    if (!w.running) return false;
  }
  return true;
}

Clock::TimePoint InJobRecovery::nextLook() const { return spareWanted() ? next_spare_look_ : Clock::TimePoint::max(); }

void InJobRecovery::tick() {
  if (!spareWanted() || env_.clock().now() < next_spare_look_) return;
  if (group_.spareDeaths() >= kMaxSpareDeaths) {
    log_->warn(
        "{} spare workers died in a row while waiting; no more spares in this round: a failed worker is "
        "replaced by a new process",
        group_.spareDeaths());
    spare_given_up_ = true;
    return;
  }
  const bool capable = localRanksCapable();
  // From the look's end: a look that took its whole timeout (a store that is gone) must leave
  // the round loop its interval to reap, see the round's end and take signals.
  next_spare_look_ = env_.clock().now() + kSpareLookInterval;
  if (!capable) return;
  try {
    if (group_.startSpare()) {
      log_->info(
          "started a spare worker (pid {}): it waits, loaded, to take the place of this node's next failed "
          "worker (--recovery=in-job)",
          group_.sparePid());
    }
  } catch (const DdprunError& e) {
    log_->warn("cannot start a spare worker: {}; a failed worker is replaced by a new process", e.what());
    spare_given_up_ = true;
  }
}

// Only a program that waits for a spare's assignment may be started without a rank: ddprun's
// runtime says so in its `capable` key (common/recovery_keys.h). The look has a connection of
// its own, bounded by kSpareLookTimeout: it blocks the round loop, and a spare is never worth
// more than a look's time; a replacement's claim keeps kStoreTimeout.
bool InJobRecovery::localRanksCapable() {
  try {
    if (!look_store_) look_store_ = env_.connectStore(round_->master_addr, round_->master_port, kSpareLookTimeout);
    std::vector<std::string> keys;
    for (const Worker& w : group_.workers()) keys.push_back(recovery::capableKey(scope_, w.place.rank));
    if (!look_store_->check(keys)) return false;
    for (const std::string& key : keys) {
      if (look_store_->get(key) != recovery::kCapableSpare) {
        log_->debug("no spare worker: {} is not {}", key, recovery::kCapableSpare);
        spare_given_up_ = true;  // the program will not change within the round
        return false;
      }
    }
    return true;
  } catch (const DdprunError& e) {
    look_store_.reset();
    log_->debug("no spare worker yet: the workers' store did not answer: {}", e.what());
    return false;
  }
}

int InJobRecovery::restartsUsed(int restart_count) {
  if (config_.recovery != Recovery::kInJob) return restart_count;
  try {
    replacements_ = rendezvous_->addReplacements(0);
  } catch (const DdprunError& e) {
    log_->warn("cannot read the job's count of in-job replacements ({}); counting {} as before", e.what(),
               replacements_);
  }
  return restart_count + static_cast<int>(replacements_);
}

bool InJobRecovery::replaceFailed() {
  if (config_.recovery != Recovery::kInJob || !round_ || group_.stopping()) return false;
  std::vector<size_t> failed_at;
  std::vector<const Worker*> failed;
  for (size_t i = 0; i < group_.workers().size(); ++i) {
    if (!group_.workers()[i].failed()) continue;
    failed_at.push_back(i);
    failed.push_back(&group_.workers()[i]);
  }
  if (failed.empty()) return false;  // a collective's stderr line, no worker failed: not ours
  const int first_rank = failed.front()->place.rank;
  int generation = 0;
  if (const auto why_not = claim(failed, generation)) {
    log_->warn("rank {} failed; restarting the whole worker group, not in job: {}", first_rank, *why_not);
    return false;
  }
  const int used = round_->restart_count + static_cast<int>(replacements_);
  for (size_t i : failed_at) {
    const int rank = group_.workers()[i].place.rank;
    removeRings(rank);
    const std::string cgroup = containment_.replacing(group_.workers()[i], group_.attempt());
    Worker gone;
    bool by_spare = false;
    if (const pid_t spare = group_.sparePid(); spare > 0) {
      try {
        gone = group_.adoptSpare(i, cgroup, generation);
        by_spare = true;
      } catch (const DdprunError& e) {
        log_->warn("the spare worker (pid {}) cannot take rank {}: {}; starting a new process", spare, rank, e.what());
      }
    }
    try {
      if (!by_spare) gone = group_.replaceOne(i, cgroup, generation);
    } catch (const DdprunError& e) {
      log_->error("cannot start a replacement for rank {}: {}; restarting the whole worker group", rank, e.what());
      return false;
    }
    const Worker& newcomer = group_.workers()[i];
    log_->warn(
        "worker rank {} (pid {}) replaced alone: pid {}{} in generation {} (restart {} of {}, --recovery=in-job); the "
        "other workers run on",
        rank, gone.pid, newcomer.pid, by_spare ? " (the spare)" : "", generation, used, config_.max_restarts);
    reporter_.workerStarted(newcomer, *round_);
    reporter_.workerReplaced(gone, newcomer, used);
  }
  next_spare_look_ = env_.clock().now() + kSpareSettle;
  return true;
}

std::optional<std::string> InJobRecovery::claim(const std::vector<const Worker*>& failed, int& generation) {
  for (const Worker* w : failed) {
    if (w->hang || !w->hang_reason.empty()) return fmt::format("rank {} was stopped as hung", w->place.rank);
  }
  const std::string where = fmt::format("{}:{}", round_->master_addr, round_->master_port);
  try {
    if (!workers_store_) workers_store_ = env_.connectStore(round_->master_addr, round_->master_port, kStoreTimeout);
    // First, that this node's agent took the failure up: survivors that see no such word soon
    // give in-job recovery up (common/recovery_keys.h), as when a node is lost with its agent.
    const int64_t current = workers_store_->add(recovery::generationKey(scope_), 0);
    workers_store_->set(recovery::noticedKey(scope_, current), "1");
    const std::string abandoned = recovery::abandonedKey(scope_);
    if (workers_store_->check({abandoned})) {
      return "a worker gave up on in-job recovery: " + printable(workers_store_->get(abandoned));
    }
    if (auto missing = everyRankCapable()) return missing;
    // The budget: a replacement is a restart. Two nodes may claim the last one at once: the
    // ADD orders them, and the one past the limit gives its claim back.
    replacements_ = rendezvous_->addReplacements(0);
    const int limit = config_.max_restarts;
    if (round_->restart_count + replacements_ < limit) {
      replacements_ = rendezvous_->addReplacements(1);
      if (round_->restart_count + replacements_ > limit)
        replacements_ = rendezvous_->addReplacements(-1);
      else {
        generation = static_cast<int>(workers_store_->add(recovery::generationKey(scope_), 1));
        return std::nullopt;
      }
    }
    return fmt::format("no restarts left ({} of --max_restarts {} used)", round_->restart_count + replacements_, limit);
  } catch (const DdprunError& e) {
    workers_store_.reset();
    return fmt::format("the workers' store at {} or the job's store did not answer: {}", where, e.what());
  }
}

// Every rank of the round, not only this node's: a rank on another node that cannot re-form
// would wait for a group that never comes.
std::optional<std::string> InJobRecovery::everyRankCapable() {
  std::vector<std::string> keys;
  for (int rank = 0; rank < round_->world_size; ++rank) keys.push_back(recovery::capableKey(scope_, rank));
  if (workers_store_->check(keys)) return std::nullopt;
  for (int rank = 0; rank < round_->world_size; ++rank) {
    if (!workers_store_->check({keys[static_cast<size_t>(rank)]})) {
      return fmt::format(
          "rank {} never said it can re-form in process (a worker not on ddprun's runtime, or one that failed before "
          "it joined its group)",
          rank);
    }
  }
  return std::nullopt;  // every key came meanwhile
}

// The failed process's flight-recorder rings ("rank<r>.group<g>.ring", common/flight_ring.h):
// a collective it left pending there would read, to the hang watch, as a rank that never
// completes; the newcomer makes its own.
void InJobRecovery::removeRings(int rank) const {
  if (flight_dir_.empty()) return;
  const std::string prefix = "rank" + std::to_string(rank) + ".";
  DIR* dir = ::opendir(flight_dir_.c_str());
  if (!dir) return;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind(prefix, 0) == 0) ::unlink((flight_dir_ + "/" + name).c_str());
  }
  ::closedir(dir);
}

}  // namespace ddprun::agent
