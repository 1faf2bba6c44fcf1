#include "worker_runtime/rpc/function_registry.h"

#include <mutex>

#include "worker_runtime/rpc/internal.h"
#include "worker_runtime/rpc/rpc_agent.h"

namespace ddprun::rpc {

namespace detail {

FunctionRegistry& FunctionRegistry::instance() {
  static FunctionRegistry r;
  return r;
}

void FunctionRegistry::add(const std::string& name, AsyncFunction fn, bool run_inline) {
  std::unique_lock lock(mutex_);
  functions_[name] = {std::move(fn), run_inline};
}

std::optional<RegisteredFunction> FunctionRegistry::find(const std::string& name) const {
  std::shared_lock lock(mutex_);
  auto it = functions_.find(name);
  if (it == functions_.end()) return std::nullopt;
  return it->second;
}

void registerBuiltin(const std::string& name, AsyncFunction fn, bool run_inline) {
  FunctionRegistry::instance().add(name, std::move(fn), run_inline);
}

namespace {

// The owner's side of the RRef protocol (rref.cc is the users' side). Inline: a
// reference added and released over one connection is applied in the order it was sent.
void registerRRefBuiltins() {
  registerBuiltin(
      "ddprun.rref.add",
      [](const Args& a) {
        currentAgent()->owners().add(a.at(0).toInt(), a.at(1).toInt(), 1);
        return readyFuture({});
      },
      true);
  registerBuiltin(
      "ddprun.rref.release",
      [](const Args& a) {
        currentAgent()->owners().release(a.at(0).toInt(), a.at(1).toInt());
        return readyFuture({});
      },
      true);
  registerBuiltin(
      "ddprun.rref.fetch",
      [](const Args& a) { return currentAgent()->owners().value(a.at(0).toInt(), a.at(1).toInt()); }, true);
  registerBuiltin(
      "ddprun.rref.wait",
      [](const Args& a) {
        Future created;
        currentAgent()->owners().value(a.at(0).toInt(), a.at(1).toInt()).add_done_callback([created](const Future& v) {
          if (auto e = v.exception()) {
            created.set_exception(e);
          } else {
            created.set_result({});
          }
        });
        return created;
      },
      true);
  registerBuiltin(
      "ddprun.rref.owned_count", [](const Args&) { return readyFuture(Value(currentAgent()->owners().count())); },
      true);
}

}  // namespace

void registerBuiltins() {
  registerRRefBuiltins();
  registerAutogradBuiltins();
  registerModuleBuiltins();
  registerOptimizerBuiltins();
}

}  // namespace detail

void register_function(const std::string& name, Function fn) {
  register_async_function(name, [fn = std::move(fn)](const Args& args) {
    Future f;
    f.set_result(fn(args));
    return f;
  });
}

void register_async_function(const std::string& name, AsyncFunction fn) {
  detail::FunctionRegistry::instance().add(name, std::move(fn), false);
}

}  // namespace ddprun::rpc
