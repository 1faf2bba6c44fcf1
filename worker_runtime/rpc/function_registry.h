// The functions a worker can be called on, by name: the ones users register
// (register_function, register_async_function; before or after init_rpc) and the
// built-ins the framework itself calls ("ddprun.rref.*", "ddprun.autograd.*",
// "ddprun.module.*", "ddprun.optim.*"). One registry per process, shared by every RPC
// session in it. A built-in may run inline: on the I/O thread, in arrival order, without
// blocking (the RRef reference counts rely on that order).
//
// Thread-safety: every method is thread-safe (a reader-writer lock; lookups share it).
#pragma once

#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "worker_runtime/rpc/rpc.h"

namespace ddprun::rpc::detail {

struct RegisteredFunction {
  AsyncFunction fn;
  bool run_inline = false;
};

class FunctionRegistry {
 public:
  // The process's registry.
  static FunctionRegistry& instance();

  // Registers `fn` under `name`, replacing an earlier one.
  void add(const std::string& name, AsyncFunction fn, bool run_inline);
  // A copy of what is registered under `name`, or nullopt.
  std::optional<RegisteredFunction> find(const std::string& name) const;

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::string, RegisteredFunction> functions_;
};

// Registers every built-in (the RRef protocol's, distributed autograd's, RemoteModule's,
// DistributedOptimizer's); init_rpc calls it. They reach the agent of the running session.
void registerBuiltins();

}  // namespace ddprun::rpc::detail
