// An AgentRendezvous (agent/agent_rendezvous.h) of scripted rounds, for the round loop's
// tests: one node ("node-a:1") in a job of `nodes` nodes, its rounds formed at once, their
// ends written by this node (endRound) or by the test for another node (endElsewhere: a node
// joined, one was evicted, one failed). What the agent asked of it stays in the RoundScript,
// which the test owns and reads after the agent is gone.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/agent_rendezvous.h"
#include "tests/agent/manual_agent_env.h"

namespace ddprun::agent::testing {

struct RoundScript {
  int nodes = 1;                    // the next round's node count
  std::vector<std::string> ends;    // every end this node wrote (endRound), in order
  std::vector<std::string> states;  // every state published in the status record, in order
  bool finished = false;            // the exit barrier was reached
  int round = 0;                    // the current round
  int restarts = 0;                 // its restart count
  std::string standing;             // its end, once written (by anyone)
  int64_t replacements = 0;         // the job's in-job replacements (addReplacements)
  std::function<void(rendezvous::RoundEvent)> on_event;

  // Another node ends the current round with `reason`; this node's watcher hears it.
  void endElsewhere(const std::string& reason) {
    standing = reason;
    if (on_event) on_event(rendezvous::RoundEvent{rendezvous::RoundEvent::Kind::kEnded, round, reason});
  }
};

class ScriptedRendezvous final : public AgentRendezvous {
 public:
  ScriptedRendezvous(RoundScript& script, ManualAgentEnv& env, int nproc) : s_(script), env_(env), nproc_(nproc) {}

  rendezvous::RendezvousResult nextRound() override {
    const auto last = rendezvous::RoundEnd::parse(s_.standing);
    if (s_.round > 0 && last && last->usesRestart()) ++s_.restarts;
    ++s_.round;
    s_.standing.clear();
    s_.on_event = nullptr;
    rendezvous::RendezvousResult r;
    r.round = s_.round;
    r.group_world_size = s_.nodes;
    r.world_size = s_.nodes * nproc_;
    r.restart_count = s_.restarts;
    r.master_addr = "127.0.0.1";
    r.master_port = 29500;
    return r;
  }
  void watch(std::function<void(rendezvous::RoundEvent)> on_event) override { s_.on_event = std::move(on_event); }
  std::string endRound(const rendezvous::RoundEnd& end) override {
    s_.on_event = nullptr;
    if (!s_.standing.empty()) return s_.standing;
    s_.ends.push_back(end.format());
    s_.standing = end.format();
    return s_.standing;
  }
  // Every other node is done already: this node's "done" ends the round.
  void markDone() override { s_.endElsewhere("done"); }
  void finish() override { s_.finished = true; }
  void interrupt() override {}
  void sitOut() override {}
  std::optional<std::string> jobEndedWhileAway() override { return std::nullopt; }
  const std::string& nodeName() const override { return node_; }
  std::string storeAddress() const override { return "127.0.0.1:29400"; }
  bool hostsStore() const override { return true; }

  void publishStatus(const rendezvous::AgentRecord& record) override {
    s_.states.push_back(record.state);
    // The round loop publishes "joining" just before it runs nextRound() on a thread of its
    // own, whose end it learns through the event loop: the env waits for that, not the clock.
    if (record.state == "joining") env_.expectPost();
  }
  std::vector<std::string> gatherHangSummaries(std::chrono::milliseconds, const std::string&) override { return {}; }
  bool hangSummaryRequested() override { return false; }
  void publishHangSummary(const std::string&) override {}
  void publishProgress(const std::string&) override {}
  std::vector<std::string> readProgress(size_t, size_t) override { return {}; }
  void publishProgressMedians(const std::string&) override {}
  std::string readProgressMedians(size_t) override { return {}; }
  int64_t addReplacements(int64_t amount) override { return s_.replacements += amount; }

 private:
  RoundScript& s_;
  ManualAgentEnv& env_;
  int nproc_;
  std::string node_ = "node-a:1";
};

}  // namespace ddprun::agent::testing
