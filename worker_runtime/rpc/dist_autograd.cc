// Distributed autograd: contexts, the send/recv records the codec makes, and
// backward replayed across workers over RPC (each worker runs its own graph
// from its sends and forwards the gradients of its recvs to their senders).
#include "worker_runtime/rpc/dist_autograd.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "common/error.h"
#include "worker_runtime/rpc/internal.h"

namespace ddprun::rpc::dist_autograd {

namespace {

struct SendEntry {
  at::Tensor tensor;
  int dst;
};
struct RecvEntry {
  int src;
  int64_t send_id;
};

struct ContextState {
  explicit ContextState(int64_t i) : id(i) {}
  int64_t id;
  std::mutex mutex;
  std::unordered_map<int64_t, SendEntry> sends;
  int64_t next_send = 0;
  // recv leaves by their TensorImpl, with where their gradient goes.
  std::unordered_map<at::TensorImpl*, std::pair<at::Tensor, RecvEntry>> recvs;
  std::set<int> peers;
  std::unordered_map<at::TensorImpl*, std::pair<at::Tensor, at::Tensor>> grads;
  std::mutex backward_mutex;
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<int64_t, std::shared_ptr<ContextState>> contexts;
  std::atomic<int64_t> next{1};
};
Registry& reg() {
  static Registry r;
  return r;
}

thread_local int64_t t_current = -1;

std::shared_ptr<ContextState> find(int64_t id) {
  std::lock_guard lock(reg().mutex);
  auto it = reg().contexts.find(id);
  if (it == reg().contexts.end()) return nullptr;
  return it->second;
}

std::shared_ptr<ContextState> getOrCreate(int64_t id) {
  std::lock_guard lock(reg().mutex);
  auto& slot = reg().contexts[id];
  if (!slot) slot = std::make_shared<ContextState>(id);
  return slot;
}

std::shared_ptr<ContextState> require(int64_t id) {
  auto ctx = find(id);
  if (!ctx) throw DdprunError(fmt::format("dist_autograd: no context {} on this worker (released?)", id));
  return ctx;
}

// The leaves (AccumulateGrad variables) reachable from `roots`.
std::vector<at::Tensor> reachableLeaves(const std::vector<at::Tensor>& roots) {
  std::vector<torch::autograd::Node*> stack;
  std::unordered_set<torch::autograd::Node*> seen;
  std::vector<std::shared_ptr<torch::autograd::Node>> keep;  // grad accumulators are weakly held
  auto push = [&](const std::shared_ptr<torch::autograd::Node>& n) {
    if (n && seen.insert(n.get()).second) {
      keep.push_back(n);
      stack.push_back(n.get());
    }
  };
  for (const auto& r : roots) {
    if (r.grad_fn()) {
      push(r.grad_fn());
    } else if (r.requires_grad()) {
      push(torch::autograd::impl::grad_accumulator(r));
    }
  }
  std::vector<at::Tensor> leaves;
  while (!stack.empty()) {
    auto* n = stack.back();
    stack.pop_back();
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(n)) {
      leaves.push_back(acc->variable);
      continue;
    }
    for (const auto& e : n->next_edges()) push(e.function);
  }
  return leaves;
}

void accumulate(ContextState& ctx, const at::Tensor& leaf, const at::Tensor& grad) {
  std::lock_guard lock(ctx.mutex);
  auto& slot = ctx.grads[leaf.unsafeGetTensorImpl()];
  if (!slot.second.defined()) {
    slot = {leaf, grad.detach()};
  } else {
    slot.second = slot.second + grad.detach();
  }
}

// Sends each recv leaf's gradient back to its sender and waits for the senders
// (and, transitively, everything behind them) to finish.
void propagate(ContextState& ctx, const std::vector<std::pair<RecvEntry, at::Tensor>>& grads) {
  std::map<int, std::pair<Value::List, Value::List>> by_peer;
  for (const auto& [entry, g] : grads) {
    auto& [ids, tensors] = by_peer[entry.src];
    ids.emplace_back(entry.send_id);
    tensors.emplace_back(g.detach());
  }
  std::vector<Future> futures;
  for (auto& [peer, lists] : by_peer) {
    futures.push_back(detail::callRank(peer, "ddprun.autograd.backward",
                                       {ctx.id, std::move(lists.first), std::move(lists.second)}, kDefaultTimeout, -1));
  }
  wait_all(futures);
}

// Splits leaf gradients into recv gradients (to forward) and parameter
// gradients (kept).
std::vector<std::pair<RecvEntry, at::Tensor>> collect(ContextState& ctx, const std::vector<at::Tensor>& leaves,
                                                      const std::vector<at::Tensor>& grads) {
  std::vector<std::pair<RecvEntry, at::Tensor>> forward;
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (!grads[i].defined()) continue;
    std::optional<RecvEntry> recv;
    {
      std::lock_guard lock(ctx.mutex);
      auto it = ctx.recvs.find(leaves[i].unsafeGetTensorImpl());
      if (it != ctx.recvs.end()) recv = it->second.second;
    }
    if (recv) {
      forward.emplace_back(*recv, grads[i]);
    } else {
      accumulate(ctx, leaves[i], grads[i]);
    }
  }
  return forward;
}

std::vector<std::pair<RecvEntry, at::Tensor>> localBackward(ContextState& ctx, const Value::List& ids,
                                                            const Value::List& grads);

// A peer's part of backward: continue from the sends whose gradients arrived.
Future remoteBackward(const Args& a) {
  const int64_t id = a.at(0).toInt();
  auto ctx = require(id);
  const auto& ids = a.at(1).toList();
  const auto& grads = a.at(2).toList();
  std::vector<std::pair<RecvEntry, at::Tensor>> onward;
  {
    // Only the local pass is serialized: propagation may come back here (A -> B
    // -> A).
    std::lock_guard backward_lock(ctx->backward_mutex);
    onward = localBackward(*ctx, ids, grads);
  }
  propagate(*ctx, onward);
  Future done;
  done.set_result({});
  return done;
}

std::vector<std::pair<RecvEntry, at::Tensor>> localBackward(ContextState& ctx, const Value::List& ids,
                                                            const Value::List& grads) {
  const int64_t id = ctx.id;
  auto* c = &ctx;
  std::vector<at::Tensor> outputs, output_grads;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::lock_guard lock(c->mutex);
    auto it = c->sends.find(ids[i].toInt());
    if (it == c->sends.end())
      throw DdprunError(fmt::format("dist_autograd: context {} has no send {}", id, ids[i].toInt()));
    outputs.push_back(it->second.tensor);
    output_grads.push_back(grads.at(i).toTensor());
  }
  auto leaves = reachableLeaves(outputs);
  if (leaves.empty()) return {};
  auto result = torch::autograd::grad(outputs, leaves, output_grads,
                                      /*retain_graph=*/true, /*create_graph=*/false,
                                      /*allow_unused=*/true);
  return collect(ctx, leaves, result);
}

void releaseContext(int64_t id, int from) {
  std::shared_ptr<ContextState> ctx;
  {
    std::lock_guard lock(reg().mutex);
    auto it = reg().contexts.find(id);
    if (it == reg().contexts.end()) return;
    ctx = std::move(it->second);
    reg().contexts.erase(it);
  }
  std::set<int> peers;
  {
    std::lock_guard lock(ctx->mutex);
    peers = ctx->peers;
  }
  for (int peer : peers) {
    if (peer == from || peer == detail::selfRank()) continue;
    try {
      detail::callRank(peer, "ddprun.autograd.release", {id}, kDefaultTimeout, -1);
    } catch (const std::exception&) {
      // A peer that is gone has nothing left to release.
    }
  }
}

}  // namespace

Context::Context() : previous_(t_current) {
  id_ = (static_cast<int64_t>(detail::selfRank()) << 40) | reg().next.fetch_add(1);
  getOrCreate(id_);
  t_current = id_;
}

Context::~Context() {
  t_current = previous_;
  try {
    releaseContext(id_, -1);
  } catch (const std::exception&) {
    // The agent is gone: nothing to release remotely.
  }
}

int64_t current_context_id() { return t_current; }

void backward(int64_t context_id, const std::vector<at::Tensor>& roots, bool retain_graph) {
  auto ctx = require(context_id);
  for (const auto& r : roots) {
    if (!r.requires_grad()) throw DdprunError("dist_autograd.backward: a root does not require grad");
  }
  std::unique_lock backward_lock(ctx->backward_mutex);
  auto leaves = reachableLeaves(roots);
  // The ordinary engine runs the local part (so hooks such as DDP's fire);
  // every leaf's .grad is set aside first and put back after, so gradients end
  // up only in the context.
  std::vector<at::Tensor> previous;
  previous.reserve(leaves.size());
  for (auto& leaf : leaves) {
    previous.push_back(leaf.grad());
    leaf.mutable_grad().reset();
  }
  std::vector<at::Tensor> grads(leaves.size());
  try {
    torch::autograd::backward(roots, {}, retain_graph);
  } catch (...) {
    for (size_t i = 0; i < leaves.size(); ++i) leaves[i].mutable_grad() = previous[i];
    throw;
  }
  for (size_t i = 0; i < leaves.size(); ++i) {
    grads[i] = leaves[i].grad();
    leaves[i].mutable_grad() = previous[i];
  }
  auto onward = collect(*ctx, leaves, grads);
  backward_lock.unlock();  // propagation may come back to this worker
  propagate(*ctx, onward);
}

std::vector<std::pair<at::Tensor, at::Tensor>> get_gradients(int64_t context_id) {
  auto out = detail::contextGradients(context_id);
  for (auto& [p, g] : out) {
    if (g.is_sparse()) g = g.to_dense();  // users see what the dense gradient would be
  }
  return out;
}

}  // namespace ddprun::rpc::dist_autograd

namespace ddprun::rpc::detail {

using dist_autograd::t_current;

void touchContext(int64_t context_id, int peer) {
  auto ctx = dist_autograd::getOrCreate(context_id);
  std::lock_guard lock(ctx->mutex);
  ctx->peers.insert(peer);
}

int64_t recordSend(int64_t context_id, int dst, const at::Tensor& tensor) {
  auto ctx = dist_autograd::getOrCreate(context_id);
  std::lock_guard lock(ctx->mutex);
  const int64_t id = ctx->next_send++;
  ctx->sends.emplace(id, dist_autograd::SendEntry{tensor, dst});
  ctx->peers.insert(dst);
  return id;
}

at::Tensor recordRecv(int64_t context_id, int src, int64_t send_id, at::Tensor tensor) {
  auto ctx = dist_autograd::getOrCreate(context_id);
  tensor.requires_grad_(true);
  std::lock_guard lock(ctx->mutex);
  ctx->recvs[tensor.unsafeGetTensorImpl()] = {tensor, dist_autograd::RecvEntry{src, send_id}};
  ctx->peers.insert(src);
  return tensor;
}

void setCurrentContext(int64_t context_id) { t_current = context_id; }

std::vector<std::pair<at::Tensor, at::Tensor>> contextGradients(int64_t context_id) {
  auto ctx = dist_autograd::require(context_id);
  std::lock_guard lock(ctx->mutex);
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  for (const auto& [impl, pair] : ctx->grads) out.push_back(pair);
  return out;
}

void clearContexts() {
  std::unordered_map<int64_t, std::shared_ptr<dist_autograd::ContextState>> contexts;
  {
    std::lock_guard lock(dist_autograd::reg().mutex);
    contexts.swap(dist_autograd::reg().contexts);
  }
}

void registerAutogradBuiltins() {
  registerBuiltin("ddprun.autograd.backward", dist_autograd::remoteBackward, false);
  registerBuiltin(
      "ddprun.autograd.release",
      [](const Args& a) {
        dist_autograd::releaseContext(a.at(0).toInt(), currentCaller());
        Future f;
        f.set_result({});
        return f;
      },
      false);
}

}  // namespace ddprun::rpc::detail
