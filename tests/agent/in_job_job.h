// One node's job under --recovery=in-job on the round loop's fake world (manual_agent_env.h,
// scripted_rendezvous.h, an in-memory workers' store), shared by the in-job recovery tests
// (in_job_recovery_test.cc) and the spare's (spare_worker_test.cc).
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "agent/elastic_agent.h"
#include "common/env_names.h"
#include "common/recovery_keys.h"
#include "tests/agent/manual_agent_env.h"
#include "tests/agent/scripted_rendezvous.h"
#include "tests/support/in_memory_store.h"

namespace ddprun::agent::testing {

// One node's job with --recovery=in-job: the config, the fake world, the scripted rounds and
// the workers' store, with a log directory of its own that goes with it. `scripter` is the
// fake workers' behaviour; every worker whose rank is not in `not_capable` writes its
// `capable` key (= `capable`) at its start. A spare (spare_worker.h), which has no rank yet,
// writes nothing. The spare is off unless a test turns config.recovery_spare on.
class InJobJob {
 public:
  InJobJob(int nproc, int max_restarts, ManualAgentEnv::Scripter scripter, std::set<int> not_capable = {})
      : env([this, scripter, not_capable](const SpawnRequest& r) {
          if (r.env.count(recovery::kSpareEnv)) return scripter(r);
          const int rank = std::stoi(r.env.at(env::kRank));
          if (!not_capable.count(rank)) {
            store.set(recovery::capableKey(recovery::roundScope(std::stoi(r.env.at(env::kRestartCount))), rank),
                      capable);
          }
          return scripter(r);
        }) {
    static std::atomic<int> count{0};
    const std::string id = "in-job-" + std::to_string(::getpid()) + "-" + std::to_string(count++);
    dir_ = std::filesystem::temp_directory_path() / ("ddprun_" + id);
    std::filesystem::create_directories(dir_);
    config.entrypoint = {"/fake/worker"};
    config.entry_name = "worker";
    config.nproc_per_node = nproc;
    config.max_restarts = max_restarts;
    config.recovery = Recovery::kInJob;
    config.recovery_spare = false;
    config.term_timeout = std::chrono::milliseconds(2000);
    config.cgroups = false;
    config.log_dir = dir_.string();
    config.events_file = (dir_ / "events.jsonl").string();
    config.rendezvous.run_id = id;
    env.workers_store = &store;
  }
  ~InJobJob() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  int run() {
    ElasticAgent agent(config, nullptr, env,
                       [this] { return std::make_unique<ScriptedRendezvous>(rounds, env, config.nproc_per_node); });
    return agent.run();
  }

  std::vector<std::string> events(const std::string& event) const {
    std::vector<std::string> found;
    std::ifstream in(*config.events_file);
    for (std::string line; std::getline(in, line);) {
      if (line.find("\"event\":\"" + event + "\"") != std::string::npos) found.push_back(line);
    }
    return found;
  }
  // The round's generation counter as the workers would read it (0: never bumped).
  int64_t generation(int restart_count = 0) {
    return store.add(recovery::generationKey(recovery::roundScope(restart_count)), 0);
  }

  rendezvous::InMemoryStore store;
  std::string capable = recovery::kCapable;  // what the workers write to their `capable` key
  AgentConfig config;
  ManualAgentEnv env;
  RoundScript rounds;

 private:
  std::filesystem::path dir_;
};

}  // namespace ddprun::agent::testing
