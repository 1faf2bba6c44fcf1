// The users' side of RRefs: handles, their release when the last one on a worker goes,
// and what encoding and decoding an RRef does to the owner's reference count. The owner's
// side is RRefOwnerTable and the "ddprun.rref.*" built-ins (function_registry.cc).
#include <fmt/format.h>

#include "common/error.h"
#include "worker_runtime/rpc/dist_autograd.h"
#include "worker_runtime/rpc/internal.h"
#include "worker_runtime/rpc/rpc.h"
#include "worker_runtime/rpc/rpc_agent.h"

namespace ddprun::rpc {

using detail::currentAgent;
using detail::currentAgentOrNull;

void detail::forkRRef(const RRefState& state, int dst) {
  auto a = currentAgent();
  if (state.owner == a->rank()) {
    a->owners().add(state.creator, state.serial,
                    1);  // the receiver's new reference, counted now
  } else if (dst != state.owner) {
    // A third worker: the owner must count it before this message can reach it.
    a->call(state.owner, "ddprun.rref.add", {state.creator, state.serial}, kDefaultTimeout, -1).wait();
  }
  // dst == owner: the owner counts it when it decodes the message (same
  // connection order).
}

std::shared_ptr<detail::RRefState> detail::adoptRRef(int owner, int64_t creator, int64_t serial, int src) {
  auto a = currentAgent();
  if (owner < 0 || owner >= a->worldSize() || creator < 0 || creator >= a->worldSize() || serial < 0) {
    throw DdprunError(
        fmt::format("rpc: malformed message (RRef {}:{}:{} in a job of {})", owner, creator, serial, a->worldSize()));
  }
  auto state = std::make_shared<RRefState>();
  state->owner = owner;
  state->creator = creator;
  state->serial = serial;
  if (owner == a->rank()) {
    if (src != owner) a->owners().add(creator, serial, 1);
    try {
      state->local = a->owners().value(creator, serial);
      state->has_local = true;
    } catch (const DdprunError&) {
      state->has_local = false;
    }
  }
  return state;
}

detail::RRefState::~RRefState() {
  auto a = currentAgentOrNull();
  if (!a || !a->running() || owner < 0) return;
  try {
    if (owner == a->rank()) {
      local = Future();  // drop our hold on the value before the owner may free it
      a->owners().release(creator, serial);
    } else {
      // On the pool: the last handle may die on the I/O thread (a decoded message), which
      // must not wait to connect to the owner. Counted as a pending call until sent, so
      // shutdown waits for it.
      a->sendInBackground([a, owner = owner, creator = creator, serial = serial] {
        a->call(owner, "ddprun.rref.release", {creator, serial}, kDefaultTimeout, -1);
      });
    }
  } catch (const std::exception& e) {
    rpcLog()->debug("rpc: releasing RRef {}:{}:{}: {}", owner, creator, serial, e.what());
  }
}

void detail::waitCreated(const RRef& r) {
  auto a = currentAgent();
  const auto& s = r.state();
  if (s->owner == a->rank()) {
    r.local_value();
  } else {
    a->call(s->owner, "ddprun.rref.wait", {s->creator, s->serial}, kDefaultTimeout, -1).wait();
  }
}

Value detail::ownedValue(int64_t creator, int64_t serial) {
  return currentAgent()->owners().value(creator, serial).wait();
}

RRef::RRef(Value value) {
  auto a = currentAgent();
  auto [creator, serial] = a->owners().newId();
  Future f;
  f.set_result(std::move(value));
  a->owners().registerValue(creator, serial, f, 1);
  auto s = std::make_shared<detail::RRefState>();
  s->owner = a->rank();
  s->creator = creator;
  s->serial = serial;
  s->local = f;
  s->has_local = true;
  state_ = std::move(s);
}

WorkerInfo RRef::owner() const {
  DDPRUN_CHECK(state_, "RRef::owner() on an empty RRef");
  return currentAgent()->info(state_->owner);
}
bool RRef::is_owner() const { return state_ && state_->owner == currentAgent()->rank(); }
std::string RRef::id() const {
  DDPRUN_CHECK(state_, "RRef::id() on an empty RRef");
  return fmt::format("{}:{}:{}", state_->owner, state_->creator, state_->serial);
}
Value RRef::to_here(std::chrono::milliseconds timeout) const {
  DDPRUN_CHECK(state_, "RRef::to_here() on an empty RRef");
  auto a = currentAgent();
  if (state_->owner == a->rank()) {
    if (!state_->has_local) throw DdprunError("rpc: RRef " + id() + " no longer exists on its owner");
    Future f = state_->local;
    if (!f.wait_for(a->timeoutOr(timeout))) throw RpcTimeout("rpc: RRef " + id() + ": value not ready in time");
    return f.value();
  }
  return a
      ->call(state_->owner, "ddprun.rref.fetch", {state_->creator, state_->serial}, timeout,
             dist_autograd::current_context_id())
      .wait();
}
Value RRef::local_value() const {
  DDPRUN_CHECK(state_, "RRef::local_value() on an empty RRef");
  if (!state_->has_local) {
    throw DdprunError(fmt::format("rpc: RRef {} is owned by {}, not this worker", id(), owner().name));
  }
  return state_->local.wait();
}

int64_t owned_rref_count() { return currentAgent()->owners().count(); }

}  // namespace ddprun::rpc
