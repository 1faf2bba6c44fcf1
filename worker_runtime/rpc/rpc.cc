// rpc.h's session functions (init_rpc, shutdown, the calls) over the process's RpcAgent,
// and the internal.h entry points the other pieces (distributed autograd, RemoteModule,
// DistributedOptimizer) reach the agent through. The pieces themselves:
//   message_codec   values, tensors and messages to and from bytes
//   connection      one peer connection: handshake, reading messages, writing them
//   pending_calls   the calls awaiting an answer; completing and failing them
//   function_registry  registered functions and the built-ins
//   rpc_agent       the RpcAgent: store, listening, peers, dispatch, shutdown
//   future, rref, rref_owner_table, value   the user-facing types
// worker_runtime/THREADING.md says which thread runs what.
#include "worker_runtime/rpc/rpc.h"

#include <fmt/format.h>

#include <exception>
#include <memory>

#include "worker_runtime/rpc/dist_autograd.h"
#include "worker_runtime/rpc/function_registry.h"
#include "worker_runtime/rpc/internal.h"
#include "worker_runtime/rpc/rpc_agent.h"

namespace ddprun::rpc {

using detail::currentAgent;
using detail::currentAgentOrNull;

void init_rpc(const std::string& name, int rank, int world_size, const RpcBackendOptions& options) {
  if (name.empty()) throw DdprunError("init_rpc: the worker name is empty");
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw DdprunError(fmt::format("init_rpc: rank {} of world size {}", rank, world_size));
  }
  if (currentAgentOrNull()) throw DdprunError("init_rpc: RPC is already initialized");
  detail::registerBuiltins();
  auto a = std::make_shared<detail::RpcAgent>(name, rank, world_size, options);
  a->start();
  // Current before it serves: the built-ins a peer may call at once look the agent up.
  detail::setCurrentAgent(a);
  try {
    a->serve();
  } catch (...) {
    detail::setCurrentAgent(nullptr);
    a->stop();
    throw;
  }
}

bool is_initialized() { return currentAgentOrNull() != nullptr; }

void shutdown() {
  auto a = currentAgent();
  std::exception_ptr error;
  try {
    a->gracefulShutdown();
  } catch (...) {
    error = std::current_exception();
  }
  detail::clearContexts();
  a->stop();
  detail::setCurrentAgent(nullptr);
  if (error) std::rethrow_exception(error);
}

WorkerInfo get_worker_info() {
  auto a = currentAgent();
  return a->info(a->rank());
}
WorkerInfo get_worker_info(const std::string& name) {
  auto a = currentAgent();
  return a->info(a->rankOf(name));
}
std::vector<WorkerInfo> get_all_worker_infos() {
  auto a = currentAgent();
  std::vector<WorkerInfo> out;
  for (int r = 0; r < a->worldSize(); ++r) out.push_back(a->info(r));
  return out;
}

Future rpc_async(const std::string& to, const std::string& func, const Args& args, std::chrono::milliseconds timeout) {
  auto a = currentAgent();
  return a->call(a->rankOf(to), func, args, timeout, dist_autograd::current_context_id());
}
Value rpc_sync(const std::string& to, const std::string& func, const Args& args, std::chrono::milliseconds timeout) {
  return rpc_async(to, func, args, timeout).wait();
}
RRef remote(const std::string& to, const std::string& func, const Args& args, std::chrono::milliseconds timeout) {
  auto a = currentAgent();
  return a->remote(a->rankOf(to), func, args, timeout);
}

// ---- detail ----

const std::shared_ptr<spdlog::logger>& detail::rpcLog() {
  static const auto l = logger("rpc");
  return l;
}
int detail::selfRank() { return currentAgent()->rank(); }
WorkerInfo detail::workerInfo(int rank) { return currentAgent()->info(rank); }
Future detail::callRank(int rank, const std::string& func, const Args& args, std::chrono::milliseconds timeout,
                        int64_t context_id) {
  return currentAgent()->call(rank, func, args, timeout, context_id);
}
void detail::post(std::function<void()> fn) {
  if (auto a = currentAgentOrNull()) {
    a->post(std::move(fn));
  } else {
    fn();
  }
}

}  // namespace ddprun::rpc
