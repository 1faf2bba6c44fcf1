#include "worker_runtime/ddp/reducer.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <unordered_set>

#include "common/error.h"
#include "worker_runtime/recovery/in_job.h"

namespace ddprun::ddp {
namespace {

// Runs after AccumulateGrad, i.e. once the parameter's .grad holds this backward's sum.
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(Reducer* reducer, size_t index, void (Reducer::*ready)(size_t))
      : reducer_(reducer), index_(index), ready_(ready) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    (reducer_->*ready_)(index_);
    return outputs;
  }

 private:
  Reducer* reducer_;
  size_t index_;
  void (Reducer::*ready_)(size_t);
};

int64_t bytesOf(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, dist::Group group,
                 const DDPOptions& options)
    : params_(std::move(params)),
      names_(std::move(names)),
      group_(std::move(group)),
      hook_(allreduce_hook),
      find_unused_(options.find_unused_parameters),
      control_device_(params_.front().device()) {
  // Reverse registration order: backward produces the last layers' gradients first.
  const auto first_cap = static_cast<int64_t>(options.first_bucket_cap_mb * 1024 * 1024);
  const auto cap = static_cast<int64_t>(options.bucket_cap_mb * 1024 * 1024);
  slots_.resize(params_.size());
  struct Open {
    at::ScalarType dtype;
    at::Device device;
    size_t bucket;
    int64_t bytes;
  };
  // One open bucket per dtype and device: a bucket is one flat tensor, reduced by the backend of
  // its device (a model spread over cuda:0 and the CPU has buckets on each).
  std::vector<Open> open;
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    Open* current = nullptr;
    for (auto& o : open) {
      if (o.dtype == p.scalar_type() && o.device == p.device()) current = &o;
    }
    const int64_t limit = buckets_.empty() || (current && current->bucket == 0) ? first_cap : cap;
    if (current == nullptr || (current->bytes > 0 && current->bytes + bytesOf(p) > limit)) {
      buckets_.emplace_back();
      if (current == nullptr) {
        open.push_back({p.scalar_type(), p.device(), buckets_.size() - 1, 0});
        current = &open.back();
      } else {
        *current = {p.scalar_type(), p.device(), buckets_.size() - 1, 0};
      }
    }
    Bucket& b = buckets_[current->bucket];
    const int64_t offset = b.offsets.empty() ? 0 : b.offsets.back() + params_[b.params.back()].numel();
    b.params.push_back(k);
    b.offsets.push_back(offset);
    slots_[k] = {current->bucket, offset, p.numel()};
    current->bytes += bytesOf(p);
  }
  for (auto& b : buckets_) {
    const at::Tensor& first = params_[b.params.front()];
    const int64_t numel = b.offsets.back() + params_[b.params.back()].numel();
    b.buffer = at::zeros({numel}, first.options().requires_grad(false));
  }
  ready_.assign(params_.size(), 0);
  locally_used_.assign(params_.size(), 0);

  for (size_t k = 0; k < params_.size(); ++k) {
    auto accumulator = torch::autograd::impl::grad_accumulator(params_[k]);
    DDPRUN_CHECK(accumulator != nullptr);
    hook_keys_.push_back(accumulator->add_post_hook(std::make_unique<GradReadyHook>(this, k, &Reducer::onGradReady)));
    accumulators_.push_back(std::move(accumulator));
  }
}

Reducer::~Reducer() {
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(hook_keys_[k]);
}

void Reducer::setCommHook(CommHook hook) {
  std::lock_guard lock(mutex_);
  if (custom_hook_) throw DdprunError("register_comm_hook: a communication hook is already registered");
  hook_ = std::move(hook);
  custom_hook_ = true;
}

void Reducer::prepareForBackward(const std::vector<at::Tensor>& outputs) {
  std::lock_guard lock(mutex_);
  expect_hooks_ = true;
  finalize_queued_ = false;
  unused_marked_ = false;
  next_bucket_ = 0;
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(locally_used_.begin(), locally_used_.end(), 0);
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.inflight.reset();
  }
  events_.clear();
  unreachable_.clear();
  // What a replacement's start-up replays ends before the first step.
  recovery::endStartup();
  if (!find_unused_) return;

  std::unordered_set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  for (const auto& out : outputs) {
    if (out.defined() && out.grad_fn()) stack.push_back(out.grad_fn().get());
    // An output that is itself a parameter reaches its accumulator directly.
    if (out.defined() && out.requires_grad() && out.is_leaf()) {
      if (auto acc = torch::autograd::impl::try_get_grad_accumulator(out)) seen.insert(acc.get());
    }
  }
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    if (seen.count(accumulators_[k].get()) == 0) unreachable_.push_back(k);
  }
}

at::Tensor Reducer::slotView(size_t index) {
  // An alias of the bucket's storage that autograd does not know as a view: LibTorch's
  // Optimizer::zero_grad() calls detach_() on every .grad, which views refuse.
  const Slot& s = slots_[index];
  const at::Tensor& buffer = buckets_[s.bucket].buffer;
  at::Tensor alias = at::empty({0}, buffer.options());
  alias.set_(buffer.storage(), buffer.storage_offset() + s.offset, params_[index].sizes());
  return alias;
}

void Reducer::onGradReady(size_t index) {
  std::lock_guard lock(mutex_);
  if (!expect_hooks_) return;  // a backward outside DDP's forward, or under no_sync()
  if (!finalize_queued_) {
    finalize_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalizeBackward(); });
  }
  if (!unused_marked_) {
    unused_marked_ = true;
    for (size_t k : unreachable_) markReadyLocked(k, false);
  }
  if (ready_[index]) return;
  events_.push_back({ReducerEvent::Kind::kGradReady, index});
  markReadyLocked(index, true);
}

void Reducer::markReadyLocked(size_t index, bool used) {
  ready_[index] = 1;
  locally_used_[index] = used ? 1 : 0;
  at::Tensor slot = slotView(index);
  const at::Tensor& grad = params_[index].grad();
  if (!used || !grad.defined()) {
    // A gradient this rank did not produce counts as zero. If .grad is our slot, keep the
    // user's value in a copy: a parameter unused on every rank keeps its gradient.
    if (grad.defined() && grad.data_ptr() == slot.data_ptr()) params_[index].mutable_grad() = grad.clone();
    slot.zero_();
  } else if (grad.data_ptr() != slot.data_ptr()) {
    slot.copy_(grad);
  }
  Bucket& b = buckets_[slots_[index].bucket];
  DDPRUN_CHECK(b.pending > 0);
  if (--b.pending == 0) launchReadyBucketsLocked();
}

HookResult Reducer::runHook(size_t bucket_index, at::Tensor buffer) {
  std::vector<at::Tensor> members;
  for (size_t k : buckets_[bucket_index].params) members.push_back(params_[k]);
  GradBucket bucket(bucket_index, std::move(buffer), std::move(members));
  bucket.set_last(bucket_index + 1 == buckets_.size());
  return hook_(group_, bucket);
}

void Reducer::launchReadyBucketsLocked() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    events_.push_back({ReducerEvent::Kind::kBucketLaunched, next_bucket_});
    Bucket& b = buckets_[next_bucket_];
    if (recovery::active()) {
      if (!b.launched.defined()) b.launched = at::empty_like(b.buffer);
      b.launched.copy_(b.buffer);
    }
    b.inflight = runHook(next_bucket_, b.buffer);
    ++next_bucket_;
  }
}

void Reducer::finalizeBackward() {
  std::unique_lock lock(mutex_);
  expect_hooks_ = false;
  // Parameters the backward never reached: zero on this rank, so the buckets still go out
  // in the same order as everywhere else.
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!ready_[k]) markReadyLocked(k, false);
  }
  DDPRUN_CHECK(next_bucket_ == buckets_.size());
  at::Tensor used_map;
  runtime::WorkPtr used_work = launchUsedMap(used_map);
  for (;;) {
    try {
      awaitReductions(used_map, used_work);
      break;
    } catch (const runtime::PeerError&) {
      if (!recovery::active()) throw;
      recoverAndRelaunch(std::current_exception(), used_map, used_work);
    }
  }
  recovery::noteReduction();

  std::vector<size_t> missing;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (find_unused_ && used_map.data_ptr<int>()[k] == 0) continue;  // unused everywhere
    if (!find_unused_ && !locally_used_[k]) missing.push_back(k);
    at::Tensor slot = slotView(k);
    at::Tensor& grad = params_[k].mutable_grad();
    if (!grad.defined() || grad.data_ptr() != slot.data_ptr()) grad = slot;
  }
  events_.push_back({ReducerEvent::Kind::kBackwardFinished, 0});
  if (!missing.empty()) {
    // The peers are in step (this rank sent zeros), but torch treats this as a user error
    // so that a silently frozen layer does not go unnoticed.
    throw DdprunError(
        fmt::format("DistributedDataParallel: parameter {} ({}) received no gradient in this backward{}; pass "
                    "find_unused_parameters=true if parts of the model are not used in every forward",
                    missing.front(), names_[missing.front()],
                    missing.size() > 1 ? fmt::format(" (and {} more)", missing.size() - 1) : std::string()));
  }
}

runtime::WorkPtr Reducer::launchUsedMap(at::Tensor& used_map) {
  if (!find_unused_) return nullptr;
  used_map = at::empty({static_cast<int64_t>(params_.size())}, at::kInt);
  std::copy(locally_used_.begin(), locally_used_.end(), used_map.data_ptr<int>());
  used_map = used_map.to(control_device_);
  return dist::all_reduce(used_map, dist::ReduceOp::MAX, group_, /*async_op=*/true);
}

void Reducer::awaitReductions(at::Tensor& used_map, runtime::WorkPtr& used_work) {
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    if (!b.inflight) continue;  // reduced before a failure of a later bucket
    b.inflight->work->wait();
    at::Tensor reduced = b.inflight->result();
    b.inflight.reset();
    if (reduced.data_ptr() != b.buffer.data_ptr()) b.buffer.copy_(reduced);
  }
  if (used_work) {
    used_work->wait();
    used_work = nullptr;
    used_map = used_map.cpu();  // after wait(): ordered after the reduction on a device
  }
}

void Reducer::recoverAndRelaunch(const std::exception_ptr& failure, at::Tensor& used_map, runtime::WorkPtr& used_work) {
  // Nothing may still write a buffer when it is restored: every op of the broken group
  // fails at once, so these waits are short.
  for (auto& b : buckets_) {
    if (!b.inflight) continue;
    try {
      b.inflight->work->wait();
    } catch (const std::exception&) {
    }
    b.inflight.reset();
  }
  if (used_work) {
    try {
      used_work->wait();
    } catch (const std::exception&) {
    }
  }
  recovery::recover(failure);
  // Every bucket again, in index order as every rank launches them, each from this rank's
  // own gradients: the retry reduces exactly what the failed step would have.
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    b.buffer.copy_(b.launched);
    b.inflight = runHook(i, b.buffer);
  }
  used_work = launchUsedMap(used_map);
}

void Reducer::shadowBackward() {
  std::lock_guard lock(mutex_);
  std::vector<HookResult> results;
  for (size_t i = 0; i < buckets_.size(); ++i) results.push_back(runHook(i, at::zeros_like(buckets_[i].buffer)));
  runtime::WorkPtr used_work;
  at::Tensor used_map;
  if (find_unused_) {
    used_map =
        at::zeros({static_cast<int64_t>(params_.size())}, at::TensorOptions().dtype(at::kInt).device(control_device_));
    used_work = dist::all_reduce(used_map, dist::ReduceOp::MAX, group_, /*async_op=*/true);
  }
  for (auto& r : results) r.work->wait();
  if (used_work) used_work->wait();
}

std::vector<std::vector<size_t>> Reducer::bucketIndices() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : buckets_) out.push_back(b.params);
  return out;
}

std::vector<ReducerEvent> Reducer::events() const {
  std::lock_guard lock(mutex_);
  return events_;
}

}  // namespace ddprun::ddp
