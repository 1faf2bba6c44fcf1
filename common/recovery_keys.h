// In-job recovery (--recovery=in-job, docs/recovery.md): the names the agent and ddprun's
// worker runtime share, spelled once here. Header only and free of torch, so that both
// the agent (agent/in_job_recovery.h) and worker_runtime/ include it without crossing
// layers.
//
// Where the keys live: the WORKERS' store, the one MASTER_ADDR:MASTER_PORT names (with
// TORCHELASTIC_USE_AGENT_STORE=True the agent hosts it; rendezvous/rounds/
// dynamic_rendezvous.h): each round's group-rank-0 agent starts a fresh one, token-free,
// so a round never sees the last round's keys. Where the workers share the rendezvous
// store instead (static without a token, as torchrun: Backend::sharedWorkersStore), the
// group-rank-0 agent deletes every key outside rdzv/ before the round's workers start. On
// top of that the keys carry the round's TORCHELASTIC_RESTART_COUNT, as the runtime's own
// process-group keys do (ddprun/pg/<restart_count>/, worker_runtime/distributed.cc): the
// round scope is roundScope(restart_count). The agent reaches the same store from
// RendezvousResult's master address and port.
//
// The protocol (same world: a failed rank is replaced by a process of the same RANK):
//  - Every worker gets DDPRUN_RECOVERY (kRecoveryEnv) = "in-job" or "restart" and
//    DDPRUN_GENERATION (kGenerationEnv) = the generation it starts in: 0 at the round's
//    first start, g+1 for a replacement started after a bump to g+1.
//  - A worker that can re-form in process (ddprun's runtime with DDPRUN_RECOVERY=in-job)
//    sets capableKey(scope, rank) = "1" (kCapable; ddprun's runtime: kCapableSpare, below)
//    once it joined the default group. A worker that
//    never writes it (Python, any other program) makes every failure in the round a
//    whole-group restart.
//  - When a worker fails and every rank of the round is capable (and restarts are left),
//    its agent ADDs 1 to generationKey(scope) (absent = 0) and starts that rank again with
//    DDPRUN_GENERATION = the value the ADD returned. Survivors wait for the key to pass the
//    generation they run in; the store's value is the truth (a newcomer's env may already
//    be behind it when another rank failed meanwhile).
//  - Before anything else about a failed worker, its agent sets noticedKey(scope, g) for the
//    generation g the worker failed in. A survivor that lost a peer waits up to
//    kNoticeWindow for that key or a newer generation; with neither, no agent took the
//    failure up (the peer's node is gone with its agent, which only the rendezvous'
//    keep-alives would tell, seconds later), and it gives up on in-job recovery at once, as
//    below, so that the whole-group restart starts as soon as under --recovery=restart.
//  - A worker that gives up on in-job recovery (its wait for the next generation timed
//    out, the re-formation failed) sets abandonedKey(scope) to a one-line reason BEFORE it
//    exits non-zero: its agent then takes the whole-group restart instead of replacing it
//    (which would only make the others wait again).
//
// The warm spare (docs/recovery.md#the-warm-spare): once every local worker of a round wrote
// `capable` = kCapableSpare (ddprun's runtime, which waits for a spare's assignment before
// main; a worker writing "1" can re-form but was never said to wait: a program that cannot
// is never started without a rank), the agent starts one more process of the same program and argv, the
// SPARE, with the workers' environment less every per-rank value (RANK, LOCAL_RANK,
// ROLE_RANK, DDPRUN_GENERATION, TORCHELASTIC_ERROR_FILE, a virtual local rank's
// CUDA_VISIBLE_DEVICES: spareEnvironment in agent/spare_worker.h), plus kSpareEnv = "1" and kSpareFdEnv = the number of
// a pipe's read end it inherits. The runtime (worker_runtime/spare_wait.h), before the program's main, reads its
// ASSIGNMENT there (common/spare_assignment.h): the variables to set and to unset that make its environment exactly the
// one a started replacement would get. It applies them and the program runs as that replacement. End of file before a
// whole assignment: the agent retired the spare (the attempt ended) or died; the spare exits 0 without running the
// program.
#pragma once

#include <cstdint>
#include <string>

namespace ddprun::recovery {

// Environment of every worker.
inline constexpr const char* kRecoveryEnv = "DDPRUN_RECOVERY";
inline constexpr const char* kGenerationEnv = "DDPRUN_GENERATION";
// kRecoveryEnv's values (and --recovery's).
inline constexpr const char* kRestart = "restart";
inline constexpr const char* kInJob = "in-job";
// capableKey's values: "1" (can re-form in process), kCapableSpare (and can be started as a
// spare: its program waits for an assignment before it reads its rank).
inline constexpr const char* kCapable = "1";
inline constexpr const char* kCapableSpare = "spare";
// A spare's environment: kSpareEnv = "1", kSpareFdEnv = its assignment pipe's descriptor.
// Neither is left in the environment of the replacement it becomes.
inline constexpr const char* kSpareEnv = "DDPRUN_SPARE";
inline constexpr const char* kSpareFdEnv = "DDPRUN_SPARE_FD";

// The round's keys: "ddprun/recovery/<restart_count>/".
inline std::string roundScope(int restart_count) { return "ddprun/recovery/" + std::to_string(restart_count) + "/"; }
// "1" once rank `rank` can re-form in process.
inline std::string capableKey(const std::string& scope, int rank) { return scope + "capable/" + std::to_string(rank); }
// The generation counter (a store ADD counter; absent means 0).
inline std::string generationKey(const std::string& scope) { return scope + "generation"; }
// Set by the agent of a worker that failed in generation `generation`, as it takes the failure up.
inline std::string noticedKey(const std::string& scope, int64_t generation) {
  return scope + "noticed/" + std::to_string(generation);
}
// How long a survivor waits for noticedKey (or a newer generation) before it gives up: an agent
// sets it within milliseconds of its worker's exit, a loaded one within a few hundred.
inline constexpr int kNoticeWindowMs = 2000;
// Set (to a reason) by a worker that gives up on in-job recovery, before it exits.
inline std::string abandonedKey(const std::string& scope) { return scope + "abandoned"; }

}  // namespace ddprun::recovery
