#include "worker_runtime/recovery/in_job.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/env_reader.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/recovery_keys.h"
#include "common/text_escape.h"
#include "worker_runtime/process_group_impl.h"
#include "worker_runtime/recovery/startup_record.h"

namespace ddprun::recovery {
namespace {

using Clock = std::chrono::steady_clock;
using dist::GlobalState;
using runtime::PeerError;

constexpr int kTag = 0x4707;  // recovery's own messages on the new group's P2P channel
constexpr auto kPoll = std::chrono::milliseconds(2);
constexpr auto kNoticeWindow = std::chrono::milliseconds(kNoticeWindowMs);

struct Session {
  bool active = false;
  std::string scope;  // the round's recovery keys (roundScope)
  runtime::BackendSpec spec;
  int rank = 0;
  int size = 1;
  int64_t generation = 0;
  std::shared_ptr<StartupRecord> record;
  bool joining = false;
  bool joined_forward = false;
  int source = -1;  // in a joining replacement: the rank its state comes from
  int64_t reductions = 0;
  StateSource state_source;
  uint64_t state_token = 0;
};

Session& session() {
  static Session s;
  return s;
}

std::string genKey(const Session& r) { return generationKey(r.scope); }
int64_t storeGeneration(GlobalState& s, const Session& r) { return s.store->add(genKey(r), 0); }
std::string worldPrefix(GlobalState& s, int64_t generation) {
  return fmt::format("{}gen/{}/world/", s.prefix, generation);
}

// Sets the round's `abandoned` key (the agent then restarts the whole group) and returns
// `why`; a store that is gone too leaves the agent to notice the exit alone.
std::string abandon(GlobalState& s, const Session& r, const std::string& why) {
  try {
    s.store->set(abandonedKey(r.scope), fmt::format("rank {}: {}", r.rank, why));
  } catch (const DdprunError&) {
  }
  return why;
}

void sendBytes(dist::ProcessGroup& world, int peer, const std::string& bytes) {
  at::Tensor size = at::tensor({static_cast<int64_t>(bytes.size())}, at::kLong);
  world.live(size, "in-job recovery").send(size, peer, kTag)->wait();
  if (bytes.empty()) return;
  at::Tensor data = at::from_blob(const_cast<char*>(bytes.data()), {static_cast<int64_t>(bytes.size())}, at::kByte);
  world.live(data, "in-job recovery").send(data, peer, kTag)->wait();
}

std::string recvBytes(dist::ProcessGroup& world, int peer) {
  at::Tensor size = at::empty({1}, at::kLong);
  world.live(size, "in-job recovery").recv(size, peer, kTag)->wait();
  std::string bytes(static_cast<size_t>(size.item<int64_t>()), '\0');
  if (bytes.empty()) return bytes;
  at::Tensor data = at::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, at::kByte);
  world.live(data, "in-job recovery").recv(data, peer, kTag)->wait();
  return bytes;
}

// Each rank's word in a new generation: whether it is a replacement, the reductions it
// completed, whether it can hand its state over.
struct Member {
  bool is_new = false;
  int64_t reductions = 0;
  bool can_serve = false;
};

struct Formed {
  int64_t generation = 0;
  std::vector<Member> members;
};

bool passed(const Clock::time_point deadline) { return Clock::now() >= deadline; }

// Waits until the store's generation is at least `min_generation`; returns it.
int64_t waitForGeneration(GlobalState& s, const Session& r, int64_t min_generation, Clock::time_point deadline) {
  for (;;) {
    const int64_t g = storeGeneration(s, r);
    if (g >= min_generation) return g;
    if (passed(deadline)) {
      throw PeerError(fmt::format("no generation {} came within {} s", min_generation,
                                  std::chrono::duration_cast<std::chrono::seconds>(s.timeout).count()));
    }
    std::this_thread::sleep_for(kPoll);
  }
}

// Waits until an agent took up the failure that ended generation r.generation (its noticed
// key, common/recovery_keys.h) or a newer generation exists. Neither by `deadline`: the lost
// peer's agent is gone with it (a node lost), and only a whole-group restart can go on.
void awaitNotice(GlobalState& s, const Session& r, Clock::time_point started, Clock::time_point deadline) {
  const std::vector<std::string> noticed{noticedKey(r.scope, r.generation)};
  for (;;) {
    if (storeGeneration(s, r) > r.generation || s.store->check(noticed)) return;
    if (passed(deadline)) {
      throw PeerError(fmt::format(
          "no agent took the failure up within {} ms (the lost peer's node is gone with its agent, or its agent is "
          "stuck)",
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - started).count()));
    }
    std::this_thread::sleep_for(kPoll);
  }
}

// Forms the default group of the newest generation at least `min_generation` with every
// rank, and exchanges each rank's Member. Starts over with a newer generation when the
// generation moves while the group forms (a replacement died too) or forming fails while a
// newer one may still come. Throws PeerError once `deadline` passes.
Formed form(GlobalState& s, Session& r, int64_t min_generation, const Member& me, Clock::time_point deadline) {
  for (;;) {
    const int64_t g = waitForGeneration(s, r, min_generation, deadline);
    const std::string present = fmt::format("{}gen/{}/present/", s.prefix, g);
    s.store->set(present + std::to_string(r.rank), "1");
    std::vector<std::string> keys;
    for (int q = 0; q < r.size; ++q) keys.push_back(present + std::to_string(q));
    bool moved = false;
    while (!s.store->check(keys)) {
      if (storeGeneration(s, r) > g) {
        moved = true;
        break;
      }
      if (passed(deadline)) throw PeerError(fmt::format("not every rank joined generation {} in time", g));
      std::this_thread::sleep_for(kPoll);
    }
    if (moved) {
      min_generation = g + 1;
      continue;
    }
    try {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      dist::Group world =
          dist::makeWorld(s, r.spec, worldPrefix(s, g), r.rank, r.size, std::max(left, std::chrono::milliseconds(1)));
      at::Tensor mine = at::tensor({int64_t{me.is_new}, me.reductions, int64_t{me.can_serve}}, at::kLong);
      std::vector<at::Tensor> all;
      for (int q = 0; q < r.size; ++q) all.push_back(at::empty({3}, at::kLong));
      world->live(mine, "in-job recovery").allGather(all, mine, false)->wait();
      Formed formed{g, {}};
      for (const auto& t : all) {
        const auto* v = t.data_ptr<int64_t>();
        formed.members.push_back({v[0] != 0, v[1], v[2] != 0});
      }
      s.world = std::move(world);
      r.generation = g;
      return formed;
    } catch (const DdprunError& e) {
      // A rank died while the group formed: its replacement comes with a newer generation.
      if (passed(deadline)) throw;
      logger("runtime")->warn("in-job recovery: generation {} did not form ({}); waiting for the next", g, e.what());
      min_generation = g + 1;
    }
  }
}

// What every rank concludes from the members alike: the rank the replacements take their
// state from, or why no recovery is possible.
struct Plan {
  int source = -1;
  std::vector<int> newcomers;
  std::string impossible;
};

Plan plan(const Formed& formed) {
  Plan p;
  for (int q = 0; q < static_cast<int>(formed.members.size()); ++q) {
    const Member& m = formed.members[q];
    if (m.is_new) {
      p.newcomers.push_back(q);
    } else if (p.source < 0) {
      p.source = q;
    } else if (m.reductions != formed.members[p.source].reductions) {
      p.impossible = fmt::format(
          "the survivors stopped at different steps (rank {} had completed {} gradient reductions, rank {} {})",
          p.source, formed.members[p.source].reductions, q, m.reductions);
    }
  }
  if (p.source < 0) {
    p.impossible = "no rank survived to take the state from";
  } else if (!p.newcomers.empty() && !formed.members[p.source].can_serve) {
    p.impossible = fmt::format(
        "rank {} cannot hand its state over (its trainer resumed without CheckpointManager::resumeLatest, or its "
        "start-up made collectives a replacement cannot be answered from)",
        p.source);
  }
  return p;
}

bool canServe(const Session& r) {
  return r.state_source && r.record && r.record->mode() == StartupRecord::Mode::kDone && r.record->usable(nullptr);
}

void installRecord(GlobalState& s, const Session& r) {
  if (!r.record || r.record->mode() == StartupRecord::Mode::kDone) return;
  s.world->wrapBackends([&r](dist::Backend& inner) { return r.record->wrap(inner); });
}

}  // namespace

bool startWorld(GlobalState& s, const runtime::BackendSpec& spec, int rank, int size, bool agent_store) {
  const std::string mode = env::stringOr(kRecoveryEnv, kRestart);
  if (mode != kRestart && mode != kInJob) {
    throw UsageError(fmt::format("{}='{}': expected '{}' or '{}'", kRecoveryEnv, printable(mode), kRestart, kInJob));
  }
  const auto generation = env::integerOr<int64_t>(kGenerationEnv, 0, 0, INT64_MAX);
  if (mode != kInJob || size < 2) return false;
  // NCCL is left out for now: its watchdog ends a survivor on a peer's loss under torch's
  // default TORCH_NCCL_ASYNC_ERROR_HANDLING before the reduction could be retried, and the
  // path has not run on a GPU. Not offering it gives such a job the whole-group restart at
  // once instead of after every survivor failed too.
  if (!agent_store || spec.cpu != runtime::DeviceBackend::kHost || spec.cuda == runtime::DeviceBackend::kNccl) {
    logger("runtime")->warn(
        "in-job recovery needs the agent's store (TORCHELASTIC_USE_AGENT_STORE) and the host backend for every "
        "device (NCCL is not covered yet); this worker does not offer it, so a failure restarts the whole group");
    return false;
  }
  Session& r = session();
  r = Session{};
  r.scope = roundScope(s.restart_count);
  r.spec = spec;
  r.rank = rank;
  r.size = size;
  if (generation == 0) {
    s.world = dist::makeWorld(s, spec, worldPrefix(s, 0), rank, size, s.timeout);
    r.record = std::make_shared<StartupRecord>(StartupRecord::Mode::kRecording);
  } else {
    // A replacement: the store's generation is the truth (another rank may have failed since
    // this one was started).
    const auto deadline = Clock::now() + s.timeout;
    try {
      const Formed formed = form(s, r, generation, Member{true, -1, false}, deadline);
      const Plan p = plan(formed);
      if (!p.impossible.empty()) throw DdprunError("in-job recovery: " + p.impossible);
      r.source = p.source;
      r.reductions = formed.members[p.source].reductions;
      r.record = StartupRecord::deserialize(recvBytes(*s.world, p.source));
      r.joining = true;
      logger("runtime")->info("in-job recovery: rank {} joined generation {}; state from rank {}", rank,
                              formed.generation, p.source);
    } catch (const DdprunError& e) {
      abandon(s, r, e.what());
      s.world.reset();
      throw;
    }
  }
  installRecord(s, r);
  r.active = true;
  // kCapableSpare: this program, on the runtime, waits for a spare's assignment before main
  // (worker_runtime/spare_wait.h), so the agent may keep a warm spare of it.
  s.store->set(capableKey(r.scope, rank), kCapableSpare);
  return true;
}

void stop() { session() = Session{}; }

bool active() { return session().active; }

void recover(const std::exception_ptr& failure) {
  Session& r = session();
  GlobalState& s = dist::state();
  std::string original = "a peer failed";
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& e) {
    original = e.what();
  }
  if (!r.active) std::rethrow_exception(failure);
  const auto started = Clock::now();
  const auto deadline = started + s.timeout;
  logger("runtime")->warn("in-job recovery: rank {} lost a peer in generation {} ({}); waiting for the next", r.rank,
                          r.generation, original);
  int64_t min_generation = r.generation + 1;
  try {
    // The links go first: a peer blocked on this rank (not on the lost one) fails at once and
    // waits too, instead of after this rank's wait.
    s.world.reset();
    awaitNotice(s, r, started, std::min(started + kNoticeWindow, deadline));
    for (;;) {
      // Aborting the links: every peer still blocked on this rank fails at once and joins too.
      s.world.reset();
      const Formed formed = form(s, r, min_generation, Member{false, r.reductions, canServe(r)}, deadline);
      const Plan p = plan(formed);
      if (!p.impossible.empty()) throw PeerError(p.impossible);
      if (r.rank != p.source || p.newcomers.empty()) break;
      try {
        for (int q : p.newcomers) {
          sendBytes(*s.world, q, r.record->serialize());
          sendBytes(*s.world, q, r.state_source());
        }
        break;
      } catch (const PeerError& e) {
        // The replacement died too: the agent starts another with a newer generation.
        logger("runtime")->warn("in-job recovery: handing the state over failed ({}); waiting for the next", e.what());
        min_generation = formed.generation + 1;
      }
    }
  } catch (const DdprunError& e) {
    s.world.reset();
    r.active = false;
    throw PeerError(abandon(s, r,
                            fmt::format("in-job recovery gave up in generation {}: {}; the failure was: {}",
                                        r.generation, e.what(), original)));
  }
  logger("runtime")->info("in-job recovery: rank {} continues in generation {} after {} ms", r.rank, r.generation,
                          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count());
}

void noteReduction() { ++session().reductions; }
int64_t reductions() { return session().reductions; }

void endStartup() {
  Session& r = session();
  if (r.record) r.record->endRecording();
}

uint64_t setStateSource(StateSource source) {
  Session& r = session();
  r.state_source = std::move(source);
  return ++r.state_token;
}

void clearStateSource(uint64_t token) {
  Session& r = session();
  if (r.state_token == token) r.state_source = nullptr;
}

bool joining() { return session().joining; }

std::string receiveState() {
  Session& r = session();
  GlobalState& s = dist::state();
  DDPRUN_CHECK(r.joining);
  try {
    r.record->finishReplay();
    std::string state = recvBytes(*s.world, r.source);
    r.joining = false;
    r.joined_forward = true;
    return state;
  } catch (const DdprunError& e) {
    abandon(s, r, e.what());
    throw;
  }
}

bool takeJoinedForward() { return std::exchange(session().joined_forward, false); }

}  // namespace ddprun::recovery
