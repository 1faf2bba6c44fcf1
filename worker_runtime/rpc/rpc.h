// torch.distributed.rpc for C++ workers, under the same names (snake_case, as
// torch spells them): functions registered by name on every worker are called
// on a named worker synchronously (rpc_sync), asynchronously (rpc_async, a
// Future) or with the result left on the callee (remote, an RRef).
//
//   rpc::register_function("add", [](const rpc::Args& a) {
//     return rpc::Value(a[0].toTensor() + a[1].toTensor());
//   });
//   rpc::init_rpc("worker" + std::to_string(rank), rank, world_size);  // MASTER_ADDR/PORT store
//   at::Tensor sum = rpc::rpc_sync("worker1", "add", {x, y}).toTensor();
//   rpc::Future f = rpc::rpc_async("worker1", "add", {x, y});
//   rpc::RRef r = rpc::remote("worker1", "add", {x, y});  // the value stays on worker1
//   at::Tensor there = r.to_here().toTensor();
//   rpc::shutdown();                                       // drains every worker
//
// Transport: one Boost.Asio TCP connection per (caller, callee) pair with
// TCP_NODELAY; requests and responses are framed messages whose tensors are
// written from their storage with one gathering write and read straight into new tensors.
// Functions run on a pool of num_worker_threads threads (they may block and
// make nested calls).
//
// Errors: an exception thrown by the remote function comes back as RemoteError
// carrying its message; a peer that dies fails every call pending on it at once
// (PeerError naming the worker), and a call with no answer fails after its
// timeout (RpcTimeout). init_rpc names the worker it waited for when the store
// times out.
//
// RRef lifetime: the owner keeps a value while any user reference to it exists
// on any worker (counted by the owner; passing an RRef to another worker adds a
// reference before the message leaves); the last release frees it.
// owned_rref_count() reads the count of values a worker owns (also callable
// remotely as the builtin "ddprun.rref.owned_count").
//
// Thread-safety: every call is thread-safe once init_rpc has returned. One RPC
// session per process (init_rpc once, shutdown once).
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "worker_runtime/peer_error.h"
#include "worker_runtime/rpc/value.h"

namespace ddprun::rpc {

using Clock = std::chrono::steady_clock;
// Passing kDefaultTimeout uses the agent's rpc_timeout.
constexpr std::chrono::milliseconds kDefaultTimeout{-1};

// The base of RPC failures other than PeerError.
class RpcError : public DdprunError {
 public:
  using DdprunError::DdprunError;
};
// The remote function threw; what() holds "<func> on <worker>: <its message>".
class RemoteError : public RpcError {
 public:
  using RpcError::RpcError;
};
// A peer vanished (connection lost or refused); names the worker and its
// address. The runtime's one PeerError, as collectives throw it: a DdprunError,
// not an RpcError (catch DdprunError for every RPC failure).
using runtime::PeerError;
// No answer within the call's timeout.
class RpcTimeout : public RpcError {
 public:
  using RpcError::RpcError;
};

struct WorkerInfo {
  std::string name;
  int id = -1;  // the rank given to init_rpc
};

struct RpcBackendOptions {
  // Threads that run incoming calls (torch's TensorPipe default is 16; 2-core
  // hosts need fewer).
  int num_worker_threads = 8;
  // Default timeout of every call (torch: 60 s).
  std::chrono::milliseconds rpc_timeout = std::chrono::seconds(60);
  // How long init_rpc waits for every worker to publish its address (torch: 30
  // min on the store).
  std::chrono::milliseconds init_timeout = std::chrono::minutes(5);
  // Store to meet through; empty: MASTER_ADDR and MASTER_PORT from the
  // environment.
  std::string store_host;
  int store_port = 0;
};

// ---- futures ----
namespace detail {
struct FutureState;
}

// The result of an asynchronous call, like torch.futures.Future. Copies share
// one state.
class Future {
 public:
  // A fresh incomplete future (for async functions and tests).
  Future();
  explicit Future(std::shared_ptr<detail::FutureState> state) : state_(std::move(state)) {}

  // Blocks until complete; returns the value or rethrows the failure.
  // Thread-safe.
  Value wait() const;
  // Blocks at most `timeout`; returns whether it completed.
  bool wait_for(std::chrono::milliseconds timeout) const;
  bool done() const;
  // The value of a completed future (throws if failed; DDPRUN_CHECK if not
  // complete).
  Value value() const;
  // Runs `fn` once this completes (at once if it has), on one of the agent's
  // worker threads (or the caller's thread when no agent runs); the returned
  // future completes with fn's result or exception. fn may block.
  Future then(std::function<Value(Future)> fn) const;
  // Like then() without a result; runs on the thread that completes the future,
  // so it must not block.
  void add_done_callback(std::function<void(const Future&)> fn) const;

  void set_result(Value value) const;
  void set_exception(std::exception_ptr error) const;
  std::exception_ptr exception() const;  // null while pending or successful

 private:
  std::shared_ptr<detail::FutureState> state_;
};

// Waits for every future; returns their values in order; rethrows the first
// failure (after all completed), like torch.futures.wait_all.
std::vector<Value> wait_all(const std::vector<Future>& futures);

// ---- RRef ----
// A reference to a value owned by one worker (torch.distributed.rpc.RRef).
// Copies share one reference. Destroying the last copy on a worker releases
// that worker's reference.
class RRef {
 public:
  RRef() = default;
  // A local value wrapped as an RRef owned by this worker (torch's RRef(obj));
  // needs init_rpc.
  explicit RRef(Value value);
  explicit RRef(std::shared_ptr<detail::RRefState> state) : state_(std::move(state)) {}

  WorkerInfo owner() const;
  std::string owner_name() const { return owner().name; }
  bool is_owner() const;
  // Fetches a copy of the value from the owner (on the owner: the value
  // itself). Blocks until the value exists; rethrows the creating function's
  // failure; throws RpcTimeout/PeerError.
  Value to_here(std::chrono::milliseconds timeout = kDefaultTimeout) const;
  // The value on its owner; throws DdprunError elsewhere or if the creating
  // call failed.
  Value local_value() const;
  // "<owner rank>:<creator rank>:<serial>", unique in the job.
  std::string id() const;
  explicit operator bool() const { return state_ != nullptr; }
  const std::shared_ptr<detail::RRefState>& state() const { return state_; }

 private:
  std::shared_ptr<detail::RRefState> state_;
};

// ---- functions ----
// A registered function: arguments in, a value out; an exception reaches the
// caller as RemoteError with its message. Runs on the callee's worker threads;
// may block.
using Function = std::function<Value(const Args&)>;
// An asynchronous function returns a Future; the reply is sent when it
// completes, without holding a worker thread (torch's
// @rpc.functions.async_execution).
using AsyncFunction = std::function<Future(const Args&)>;

// Registers under `name` (before or after init_rpc; replaces an earlier one).
// Thread-safe.
void register_function(const std::string& name, Function fn);
void register_async_function(const std::string& name, AsyncFunction fn);

// ---- the agent ----
// Publishes this worker's address in the store, waits for all world_size
// workers, and starts serving. Throws DdprunError (bad arguments, duplicate
// name, already initialized), StoreError (store unreachable or a worker missing
// after init_timeout).
void init_rpc(const std::string& name, int rank, int world_size, const RpcBackendOptions& options = {});
bool is_initialized();
// Graceful shutdown: waits until no worker has an outstanding call (this one's
// pending calls, calls being served anywhere), agreeing through the store, then
// closes everything. Blocks until every worker calls shutdown (bounded by
// rpc_timeout per round). Throws RpcError if peers do not arrive in time (the
// agent is stopped anyway).
void shutdown();

WorkerInfo get_worker_info();  // this worker
WorkerInfo get_worker_info(const std::string& name);
std::vector<WorkerInfo> get_all_worker_infos();

// Calls `func` on worker `to` and blocks for the result. Throws RemoteError,
// PeerError, RpcTimeout, DdprunError (unknown worker).
Value rpc_sync(const std::string& to, const std::string& func, const Args& args = {},
               std::chrono::milliseconds timeout = kDefaultTimeout);
// Sends the call and returns at once; the future fails as rpc_sync would throw.
Future rpc_async(const std::string& to, const std::string& func, const Args& args = {},
                 std::chrono::milliseconds timeout = kDefaultTimeout);
// Runs `func` on `to`, which keeps the result; returns at once with an RRef to
// it. A failure of the function surfaces from to_here().
RRef remote(const std::string& to, const std::string& func, const Args& args = {},
            std::chrono::milliseconds timeout = kDefaultTimeout);

// Values this worker owns for RRefs (each freed when its last user reference is
// released).
int64_t owned_rref_count();

}  // namespace ddprun::rpc
