// What the pieces of the RPC framework share and users do not see: the future
// and RRef states, calls with an explicit autograd context, built-in functions,
// and the hooks that let the wire codec record distributed-autograd sends and
// receives. The functions below that reach the agent (selfRank, callRank, post,
// ...) throw DdprunError before init_rpc and after shutdown, except where noted.
//
// Thread-safety: every function here is thread-safe; FutureState is guarded by
// its own mutex; an RRefState is immutable after it is handed out (its
// destructor runs on whichever thread drops the last handle).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/logging.h"
#include "worker_runtime/rpc/rpc.h"

namespace ddprun::rpc::detail {

struct FutureState {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  Value value;
  std::exception_ptr error;
  std::vector<std::function<void()>> callbacks;
};

// One worker's handle on an RRef; its destruction releases that worker's
// reference.
struct RRefState {
  int owner = -1;
  int64_t creator = -1;
  int64_t serial = -1;
  Future local;  // on the owner: the value's future
  bool has_local = false;
  ~RRefState();
};

// The RPC layer's logger ("rpc").
const std::shared_ptr<spdlog::logger>& rpcLog();

// A future that has already completed with `value`.
Future readyFuture(Value value = {});

// The RRef side of the codec (rref.cc). Encoding an RRef for `dst`: makes sure its
// owner counts dst's new reference before the message can reach dst (on a third
// worker this blocks on a call to the owner). Decoding one from `src`: the handle
// this worker gets; throws DdprunError on ids that cannot exist in this job.
void forkRRef(const RRefState& state, int dst);
std::shared_ptr<RRefState> adoptRRef(int owner, int64_t creator, int64_t serial, int src);

int selfRank();
WorkerInfo workerInfo(int rank);
// Calls `func` on `rank` with the given distributed-autograd context (-1:
// none).
Future callRank(int rank, const std::string& func, const Args& args, std::chrono::milliseconds timeout,
                int64_t context_id);
// The rank whose request the current thread is serving, or -1.
int currentCaller();
// A built-in function; inline ones run on the I/O thread in arrival order and
// must not block.
void registerBuiltin(const std::string& name, AsyncFunction fn, bool run_inline);
// Runs `fn` on the agent's worker threads (or at once on this thread without an
// agent; never throws for want of one).
void post(std::function<void()> fn);
// Blocks until the owner has the RRef's value; rethrows the creating function's
// failure.
void waitCreated(const RRef& rref);
// The owner-side value of an RRef this worker owns; throws DdprunError if it is
// gone.
Value ownedValue(int64_t creator, int64_t serial);

// Distributed autograd hooks for the codec (dist_autograd.cc).
void touchContext(int64_t context_id, int peer);
int64_t recordSend(int64_t context_id, int dst, const at::Tensor& tensor);
at::Tensor recordRecv(int64_t context_id, int src, int64_t send_id, at::Tensor tensor);
void setCurrentContext(int64_t context_id);
// The context's gradients as stored (an embedding's may be sparse); throws if no context.
std::vector<std::pair<at::Tensor, at::Tensor>> contextGradients(int64_t context_id);
void registerAutogradBuiltins();
void registerModuleBuiltins();
void registerOptimizerBuiltins();
// Drops every context (at shutdown).
void clearContexts();

}  // namespace ddprun::rpc::detail
