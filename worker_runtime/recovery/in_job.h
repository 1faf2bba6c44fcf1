// In-job recovery in the worker runtime (DDPRUN_RECOVERY=in-job; docs/recovery.md, the keys
// in common/recovery_keys.h). When a peer dies, the survivors keep their processes: the
// gradient reduction that failed (ddp/reducer.cc) drops the default group's links, waits for
// the agent to bump the round's generation and start the failed rank again, forms the
// default group of the new generation with it, hands it the state of the lowest surviving
// rank, and retries the reduction with its own gradients. The replacement runs the trainer
// from the top: init_process_group joins the survivors' generation, its start-up
// collectives are answered from a survivor's record (startup_record.h), and
// CheckpointManager::resumeLatest takes the state from that survivor instead of from disk.
//
// Every function here is called by the thread driving the default group (the trainer's),
// between collectives; none is thread-safe against another.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string>

#include "worker_runtime/backend/backend_spec.h"

namespace ddprun::dist {
struct GlobalState;
}

namespace ddprun::recovery {

// For init_process_group: with DDPRUN_RECOVERY=in-job on an agent's store
// (TORCHELASTIC_USE_AGENT_STORE, which outlives any worker) and the host backend for every
// device the group serves (not NCCL: docs/recovery.md), forms the default group of this worker's generation (a
// replacement, with DDPRUN_GENERATION > 0, joins the survivors and takes their start-up record), writes this rank's
// `capable` key and returns true. Otherwise returns false and the caller forms the group as without recovery. Throws
// UsageError on a malformed DDPRUN_RECOVERY or DDPRUN_GENERATION, PeerError / StoreError / DdprunError when joining
// fails (after setting the round's `abandoned` key).
bool startWorld(dist::GlobalState& s, const runtime::BackendSpec& spec, int rank, int size, bool agent_store);
// For destroy_process_group: recovery ends with the group.
void stop();

// Whether this worker recovers in job (startWorld returned true and the group still lives).
bool active();

// For a collective of a training step that failed with `failure` (a PeerError): drops the
// default group, waits up to the group timeout for the generation to pass this one, forms
// the next generation's default group (starting over when the generation moves again
// meanwhile) and, on the lowest surviving rank, sends each replacement the start-up record
// and the state (setStateSource). Returns once the caller may retry its step's collectives.
// Blocks up to the group timeout. Throws PeerError carrying `failure`'s message when no
// recovery is possible (no new generation in time, the survivors stopped at different
// steps, no state to hand over), after setting the round's `abandoned` key.
void recover(const std::exception_ptr& failure);

// The gradient reducer: one synchronized backward's reduction completed (the step counter
// a replacement resumes from counts them), and start-up is over (the record closes).
void noteReduction();
int64_t reductions();
void endStartup();

// A survivor's state as a replacement takes it (CheckpointManager serializes the model,
// optimizer, generators and progress); returns a token for clearStateSource. The latest
// registered source is used.
using StateSource = std::function<std::string()>;
uint64_t setStateSource(StateSource source);
void clearStateSource(uint64_t token);

// True in a replacement from init_process_group until it took its state.
bool joining();
// In a joining replacement: the state the lowest surviving rank sent (StateSource's bytes).
// Ends the start-up replay (which must have used the whole record). Blocks up to the group
// timeout. Throws DdprunError / PeerError after setting the round's `abandoned` key.
std::string receiveState();
// True once, at a replacement's first DDP forward after it took its state: that forward
// skips the buffers' broadcast, which the survivors made before the step that failed.
bool takeJoinedForward();

}  // namespace ddprun::recovery
