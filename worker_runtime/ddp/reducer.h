// The gradient reducer behind DistributedDataParallel (private to worker_runtime/ddp).
//
// Parameters are laid out in buckets (reverse registration order, one dtype each). A post
// hook on each parameter's AccumulateGrad node copies the accumulated gradient into its
// bucket slot (nothing to copy once .grad is a view of that slot, which it becomes after
// the first reduction, like torch's gradient_as_bucket_view) and, when a bucket is
// complete, starts its communication hook on the group's collective thread. Buckets are
// started strictly in index order, the same on every rank. The first hook of a backward
// queues finalizeBackward() on the autograd engine, which runs before backward() returns:
// it fills slots of parameters that got no gradient with zeros, starts the remaining
// buckets, waits for all of them and leaves every .grad holding the average.
//
// On CUDA the same code runs on the device: buckets are device tensors, a slot is filled on the
// stream autograd ran the gradient on, and the bucket's all_reduce (NCCL) is ordered after it
// by an event of that stream; finalizeBackward() runs on the caller's streams, so waiting for
// the buckets makes the caller's stream wait, not the host.
//
// Thread-safety: the CPU autograd engine runs hooks on the thread calling backward, the CUDA
// one on a thread per device; an internal mutex serializes them.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "worker_runtime/ddp/distributed_data_parallel.h"

namespace ddprun::ddp {

class Reducer {
 public:
  // `params` are the module's parameters that require gradients, in registration order;
  // `names` their qualified names (for error messages).
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, dist::Group group, const DDPOptions& options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  void setCommHook(CommHook hook);

  // Arms the hooks for the next backward. With find_unused_parameters, walks the autograd
  // graph from `outputs` and remembers the parameters it cannot reach; they are marked
  // ready (as zero) when the first hook fires.
  void prepareForBackward(const std::vector<at::Tensor>& outputs);

  // For join(): runs this rank's side of one backward's communication with zero gradients
  // (every bucket through the comm hook, then the used-parameter map when find_unused),
  // leaving this rank's gradients alone. Blocks until done; throws PeerError.
  void shadowBackward();

  std::vector<std::vector<size_t>> bucketIndices() const;
  std::vector<ReducerEvent> events() const;

 private:
  struct Bucket {
    std::vector<size_t> params;    // parameter indices, in slot order
    std::vector<int64_t> offsets;  // element offset of each parameter's slot
    at::Tensor buffer;             // flat gradients of the whole bucket
    size_t pending = 0;            // parameters not yet ready in this backward
    std::optional<HookResult> inflight;
    // With in-job recovery: this rank's gradients as the bucket was launched. The reduction
    // runs in place (and .grad is a view of the buffer), so a reduction that failed, or one
    // that succeeded before another bucket's failed, must start again from this copy.
    at::Tensor launched;
  };
  struct Slot {
    size_t bucket;
    int64_t offset;
    int64_t numel;
  };

  void onGradReady(size_t index);
  void markReadyLocked(size_t index, bool used);
  void launchReadyBucketsLocked();
  void finalizeBackward();
  // finalizeBackward()'s wait for the buckets (and the used-parameter map); throws the first
  // failure.
  void awaitReductions(at::Tensor& used_map, runtime::WorkPtr& used_work);
  // After a failed reduction, with in-job recovery: waits out what is still in flight, has
  // the runtime re-form the group (recovery/in_job.h; rethrows when it cannot) and starts
  // every bucket again from the gradients it was launched with.
  void recoverAndRelaunch(const std::exception_ptr& failure, at::Tensor& used_map, runtime::WorkPtr& used_work);
  runtime::WorkPtr launchUsedMap(at::Tensor& used_map);
  at::Tensor slotView(size_t index);
  HookResult runHook(size_t bucket_index, at::Tensor buffer);

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  dist::Group group_;
  CommHook hook_;
  bool custom_hook_ = false;
  const bool find_unused_;
  // Where the used-parameter map is reduced: the first parameter's device (a device the group's
  // backend serves, as the buckets must be).
  const at::Device control_device_;

  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;
  // Kept alive here: a parameter's AccumulateGrad node lives only as long as someone
  // holds it, and the hooks are attached to these very nodes.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;

  mutable std::mutex mutex_;
  bool expect_hooks_ = false;  // armed by prepareForBackward, disarmed by finalize
  bool finalize_queued_ = false;
  bool unused_marked_ = false;
  size_t next_bucket_ = 0;
  std::vector<uint8_t> ready_;  // per parameter, this backward
  std::vector<uint8_t> locally_used_;
  std::vector<size_t> unreachable_;  // find_unused: parameters the forward graph missed
  std::vector<ReducerEvent> events_;
};

}  // namespace ddprun::ddp
