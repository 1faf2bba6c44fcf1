// DistributedDataParallel for LibTorch modules, behaving like PyTorch's
// torch.nn.parallel.DistributedDataParallel:
//
//   auto net = std::make_shared<Net>();                 // any torch::nn::Module with forward()
//   ddprun::ddp::DistributedDataParallel<Net> model(net);
//   torch::optim::SGD opt(model.parameters(), 0.01);
//   auto loss = torch::nn::functional::cross_entropy(model(x), y);
//   loss.backward();                                    // every .grad now holds the average
//   opt.step();
//
// Construction checks that every rank has the same parameter shapes (the first mismatch is
// named) and broadcasts parameters and buffers from rank 0 of the group. Gradients are
// gathered into buckets in reverse registration order (a small first bucket, then
// bucket_cap_mb); autograd hooks mark parameters ready, and each bucket's all_reduce starts
// on the group's collective thread as soon as it is full, while backward goes on. Buckets
// are reduced in index order on every rank, so a parameter that got no gradient on some
// rank can delay its bucket but never deadlock the group. Before backward() returns, every
// bucket is waited for and every .grad holds the averaged value.
//
// Thread-safety: one DistributedDataParallel is driven by one thread at a time (forward,
// backward and the optimizer step are sequential, as in torch).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "worker_runtime/distributed.h"

namespace ddprun::ddp {

struct DDPOptions {
  // The group gradients are averaged over; empty = the default group.
  dist::Group process_group;
  // Bucket capacity in MiB (torch's bucket_cap_mb). Default 25.
  double bucket_cap_mb = 25.0;
  // Capacity of the first bucket (the last parameters), small so the first reduction starts
  // early in backward, as torch's 1 MiB first bucket. Default 1.
  double first_bucket_cap_mb = 1.0;
  // Broadcast buffers (e.g. BatchNorm running stats) from rank 0 before each forward. Default true.
  bool broadcast_buffers = true;
  // Traverse each forward's output graph and reduce parameters it does not reach at once
  // (their gradient counts as zero on this rank). Without it, a parameter that gets no
  // gradient is still reduced (as zero) at the end of backward, so peers never hang, and
  // then backward throws a DdprunError naming it. Default false.
  bool find_unused_parameters = false;
  // torch's device_ids: one device per process. Empty (the default): the module stays where it
  // is, on the CPU, one CUDA device or spread over several (a model on cuda:0 and the CPU works).
  // {i}: every parameter must be on cuda:i, and each forward's tensor arguments are moved
  // there. More than one device is an error, as in torch 2.x.
  std::vector<int> device_ids;
};

// Where a rank's model goes by torch's convention: cuda:(LOCAL_RANK modulo the visible CUDA
// devices) where this LibTorch has CUDA and a device is visible, else the CPU.
at::Device default_device();
// A trainer's --device: "cpu", "auto" (default_device()) or "cuda" (default_device(), and a
// UsageError where that is the CPU).
at::Device device_from_choice(const std::string& choice);

// One bucket handed to a communication hook: a flat, contiguous buffer holding the
// bucket's gradients (already divided by nothing: the hook decides how to average).
class GradBucket {
 public:
  GradBucket(size_t index, at::Tensor buffer, std::vector<at::Tensor> parameters)
      : index_(index), buffer_(std::move(buffer)), parameters_(std::move(parameters)) {}
  // Position in reduction order (0 = the first bucket reduced, holding the last parameters).
  size_t index() const { return index_; }
  // Flat gradients of this rank, one dtype; the hook may modify or replace it.
  at::Tensor& buffer() { return buffer_; }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  bool is_last() const { return is_last_; }
  void set_last(bool last) { is_last_ = last; }

 private:
  size_t index_;
  at::Tensor buffer_;
  std::vector<at::Tensor> parameters_;
  bool is_last_ = false;
};

// What a communication hook returns: the Work it started (on the group's collective
// thread) and a function that, once the Work is done, returns the averaged flat gradient
// (same numel and dtype as the bucket's buffer). `result` runs on the thread finishing
// backward.
struct HookResult {
  runtime::WorkPtr work;
  std::function<at::Tensor()> result;
};
using CommHook = std::function<HookResult(const dist::Group& group, GradBucket& bucket)>;

// The default: all_reduce(SUM) of the buffer, divided by the group size.
HookResult allreduce_hook(const dist::Group& group, GradBucket& bucket);
// Compress to float16 / bfloat16 for the wire (half the bytes of float32), average, and
// decompress into the bucket's dtype, like torch's default_hooks.fp16_compress_hook.
HookResult fp16_compress_hook(const dist::Group& group, GradBucket& bucket);
HookResult bf16_compress_hook(const dist::Group& group, GradBucket& bucket);

// The engine behind DistributedDataParallel<M>, independent of the module's forward type.
class Reducer;

// Records, for tests and diagnostics, when each bucket's reduction started relative to the
// autograd hooks: a list of ("hook", param index) and ("launch", bucket index) events of
// the latest backward, in the order they happened.
struct ReducerEvent {
  enum class Kind { kGradReady, kBucketLaunched, kBackwardFinished } kind;
  size_t index;
};

class DistributedDataParallelBase {
 public:
  DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module, DDPOptions options);
  ~DistributedDataParallelBase();
  DistributedDataParallelBase(const DistributedDataParallelBase&) = delete;
  DistributedDataParallelBase& operator=(const DistributedDataParallelBase&) = delete;

  // The wrapped module's parameters (pass these to the optimizer).
  std::vector<at::Tensor> parameters() const;

  // Gradient accumulation: while the returned guard lives, backward() accumulates local
  // gradients without communicating; the first backward after it ends reduces the sum.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallelBase& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallelBase& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // Replaces the default all_reduce with `hook` for every bucket. Call before the first
  // backward; throws DdprunError if called twice, like torch.
  void register_comm_hook(CommHook hook);

  // Uneven inputs, like torch's `with model.join():`. Runs `loop` (this rank's training
  // loop); when this rank's loop ends before the others', it keeps shadowing their
  // gradient all_reduces with zeros (averaging over the whole group, torch's default
  // divide_by_initial_world_size) until every rank has finished, then takes the parameters
  // of the last rank to finish, so every rank ends with the same model. Blocks until every
  // rank's loop has ended. An exception from `loop` propagates at once (peers then fail on
  // their timeouts, naming this rank).
  void join(const std::function<void()>& loop);

  // Bucket layout: parameter indices (registration order) of each bucket, in reduction order.
  std::vector<std::vector<size_t>> bucket_indices() const;
  // Hook and launch order of the latest backward (see ReducerEvent).
  std::vector<ReducerEvent> last_backward_events() const;

  const dist::Group& process_group() const { return options_.process_group; }
  // device_ids[0], where forward moves its tensor arguments; none without device_ids.
  const std::optional<at::Device>& input_device() const { return input_device_; }

 protected:
  // Called by the typed wrapper around every forward.
  void beforeForward();
  void afterForward(const std::vector<at::Tensor>& outputs);

 private:
  void verifyShapes(const std::vector<at::Tensor>& params, const std::vector<std::string>& names);
  // Broadcasts every parameter and buffer from global rank `src`.
  void syncModuleState(int src);

  std::shared_ptr<torch::nn::Module> module_;
  DDPOptions options_;
  std::optional<at::Device> input_device_;
  // Where this class's own small collectives run (shape check, join): the first parameter's device.
  at::Device control_device_{at::kCPU};
  std::unique_ptr<Reducer> reducer_;
  bool require_sync_ = true;
  bool joining_ = false;     // inside join(): each forward first announces this rank is active
  int join_authority_ = -1;  // inside join(): the highest rank still active in the latest round
};

namespace detail {
// A forward argument moved to device_ids[0] (torch's DDP moves its inputs there); anything but a
// tensor, or any argument without device_ids, passes as it is.
template <typename T>
decltype(auto) toDevice(const std::optional<at::Device>& device, T&& arg) {
  if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
    return device ? arg.to(*device) : at::Tensor(std::forward<T>(arg));
  } else {
    return std::forward<T>(arg);
  }
}

inline void collectTensors(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
inline void collectTensors(const std::vector<at::Tensor>& v, std::vector<at::Tensor>& out) {
  out.insert(out.end(), v.begin(), v.end());
}
template <typename... T>
void collectTensors(const std::tuple<T...>& t, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... e) { (collectTensors(e, out), ...); }, t);
}
template <typename A, typename B>
void collectTensors(const std::pair<A, B>& p, std::vector<at::Tensor>& out) {
  collectTensors(p.first, out);
  collectTensors(p.second, out);
}
}  // namespace detail

// The typed wrapper: M is a torch::nn::Module subclass with a forward(...) method returning
// a tensor, a vector or tuple of tensors. Calls forward exactly as the module would.
template <typename M>
class DistributedDataParallel : public DistributedDataParallelBase {
 public:
  explicit DistributedDataParallel(std::shared_ptr<M> module, DDPOptions options = {})
      : DistributedDataParallelBase(module, std::move(options)), module_(std::move(module)) {}
  // Accepts LibTorch's module holders (torch::nn::Linear, torch::nn::Sequential, ...).
  template <typename Impl>
  explicit DistributedDataParallel(torch::nn::ModuleHolder<Impl> holder, DDPOptions options = {})
      : DistributedDataParallel(holder.ptr(), std::move(options)) {}

  template <typename... Args>
  auto forward(Args&&... args) {
    beforeForward();
    auto output = module_->forward(detail::toDevice(input_device(), std::forward<Args>(args))...);
    std::vector<at::Tensor> tensors;
    detail::collectTensors(output, tensors);
    afterForward(tensors);
    return output;
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  M* operator->() const { return module_.get(); }
  const std::shared_ptr<M>& module() const { return module_; }

 private:
  std::shared_ptr<M> module_;
};

template <typename Impl>
DistributedDataParallel(torch::nn::ModuleHolder<Impl>, DDPOptions = {}) -> DistributedDataParallel<Impl>;

}  // namespace ddprun::ddp
