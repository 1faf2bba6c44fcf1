// The NCCL backend on CUDA tensors (nccl_tensor_backend.h) inside: one communicator's backend,
// whose parts live one concern a file: the ops (nccl_ops.cc), the communicator's life from its
// making to its teardown (nccl_comms.cc) and the watchdog that fails the ops of a broken group
// and names the ranks behind (nccl_watchdog.cc). Built only against a CUDA-enabled LibTorch.
#pragma once

#include <nccl.h>

#include <c10/cuda/CUDAStream.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/env_reader.h"
#include "worker_runtime/backend/nccl_tensor_backend.h"
#include "worker_runtime/backend/nccl_tensors_impl.h"
#include "worker_runtime/backend/nccl_work_impl.h"

namespace ddprun::dist::nccl {

// ncclCommSplit appeared in NCCL 2.18; the 8-bit float types in 2.24.
constexpr bool kCanSplit = NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0);
// Ops of one communicator that may be unfinished on the GPU before the next waits. Unbounded,
// a caller that outruns the GPU fills CUDA's launch queue and then blocks inside a launch in
// NCCL; if a peer dies then, its kernel never ends, and the watchdog cannot abort the
// communicator under that call: a hang (seen on an H200, TORCH_NCCL_ASYNC_ERROR_HANDLING=0).
// With the bound, the caller waits here instead, outside NCCL, where it can be aborted. A few
// launches per op, so 64 stay well under a launch queue's 1024.
constexpr size_t kMaxInFlight = 64;

// A call on a non-blocking communicator settled: ncclInProgress waited out until `deadline`
// (still ncclInProgress when it passed), or until `stop` is set.
ncclResult_t settled(ncclComm_t comm, ncclResult_t result, Clock::time_point deadline,
                     const std::atomic<bool>* stop = nullptr);

// One group's backend: its communicator, the ops issued on it and the watchdog thread that
// watches them.
class NcclTensorBackend final : public Backend {
 public:
  explicit NcclTensorBackend(NcclGroup group) : group_(std::move(group)) {
    const int mode = env::integerOr<int>("TORCH_NCCL_ASYNC_ERROR_HANDLING", 3, 0, 3);
    tear_down_ = mode == 1 || mode == 3;
  }
  // A communicator split from the parent's (members only).
  NcclTensorBackend(NcclGroup group, ncclComm_t comm, c10::Device device) : NcclTensorBackend(std::move(group)) {
    adopt(comm, device);
  }
  ~NcclTensorBackend() override;

  std::string_view name() const override { return "nccl"; }

  // For splitNcclBackend: the communicator, when made (null before the first op).
  ncclComm_t comm() const { return comm_; }
  c10::Device device() const { return device_; }
  // Runs an NCCL call that takes the communicator (ncclCommSplit) and settles it.
  void call(const char* what, const std::function<ncclResult_t()>& body) {
    CallScope scope(*this);
    throwIfBroken();
    // No wait for the communicator to be ready first: check() left it settled after its last op.
    check(body(), what, Clock::now() + group_.timeout);
  }

  WorkPtr broadcast(at::Tensor& tensor, int root, bool async_op) override;
  WorkPtr allReduce(at::Tensor& tensor, ReduceOp op, bool async_op) override;
  WorkPtr reduce(at::Tensor& tensor, int root, ReduceOp op, bool async_op) override;
  WorkPtr allGather(std::vector<at::Tensor>& outputs, const at::Tensor& input, bool async_op) override;
  WorkPtr gather(const at::Tensor& input, std::vector<at::Tensor>* outputs, int root, bool async_op) override;
  WorkPtr scatter(at::Tensor& output, const std::vector<at::Tensor>* inputs, int root, bool async_op) override;
  WorkPtr reduceScatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, ReduceOp op, bool async_op) override;
  WorkPtr allToAll(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs, bool async_op) override;
  WorkPtr barrier(bool async_op) override;
  WorkPtr send(const at::Tensor& tensor, int peer, int /*tag: NCCL has none, as in torch*/) override;
  // One group of sends and receives and one Work for all (each item gets it).
  std::vector<WorkPtr> batchP2P(std::vector<P2PItem>& items) override;
  WorkPtr recv(at::Tensor& tensor, int peer, int /*tag*/) override;

 private:
  // Each tensor of `list` as a flat view.
  static std::vector<at::Tensor> flatViews(const std::vector<at::Tensor>& list);
  // AVG over one rank is the tensor itself: SUM there, which NCCL does as a plain copy rather
  // than its pre-multiplying kernel.
  ncclRedOp_t opOf(ReduceOp op, const at::Tensor& t, const char* what) const;
  // Issues `body` on the communication stream and settles it; then `after` (work queued behind
  // the op on that stream, such as copies out of its buffer).
  WorkPtr launch(const char* what, const std::vector<Staged>& staged, bool async_op,
                 const std::function<ncclResult_t(cudaStream_t)>& body, bool blocks_host = false,
                 const std::function<void()>& after = {});
  void makeComm(c10::Device device);
  void adopt(ncclComm_t comm, c10::Device device);
  // Settles an NCCL call on the non-blocking communicator: waits out ncclInProgress until
  // `deadline`; an error or the deadline breaks the group (and throws).
  void check(ncclResult_t result, const char* what, Clock::time_point deadline);
  void throwIfBroken();
  // Waits, outside any NCCL call, until fewer than kMaxInFlight ops are unfinished.
  void throttle();
  // Aborts the communicator, fails every pending op with `message`, and ends the process when
  // TORCH_NCCL_ASYNC_ERROR_HANDLING says so. Returns the error every later op throws.
  std::exception_ptr breakGroup(const std::string& message);
  void watchdog();
  // At teardown: waits (at most kPeerTeardownWait, or the group's timeout if shorter) until
  // every other rank has completed every op this one issued. Aborting first could cut a peer's
  // last op off: this rank's part of an op ends on its GPU while NCCL's proxy may still be
  // moving bytes the peer needs (a DDP rank that ended first failed its peer's last all_reduce
  // with "remote process exited" on an H200, ranks under load).
  void waitForPeers();
  static constexpr std::chrono::seconds kPeerTeardownWait{30};
  // Which ranks are behind op #seq, from what each published in the store.
  std::string blame(uint64_t seq);
  std::string where() const {
    return fmt::format("rank {} of {}, {}", group_.rank, group_.size, comm_ ? device_.str() : std::string("no device"));
  }
  std::string progressKey(int rank) const { return fmt::format("{}nccl/progress/{}", group_.prefix, rank); }

  NcclGroup group_;
  bool tear_down_ = true;
  // The caller's side of the communicator: one op issued at a time (NCCL needs the same order
  // on every rank), and the communicator aborted only while no call of the caller's thread is
  // inside NCCL (ncclCommAbort frees it). A group broken meanwhile is aborted as the call
  // leaves.
  class CallScope {
   public:
    explicit CallScope(NcclTensorBackend& backend) : backend_(backend), lock_(backend.launch_mutex_) {
      backend_.caller_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    }
    ~CallScope() {
      if (backend_.abort_deferred_.exchange(false)) backend_.abortOnce();
      backend_.caller_.store(std::thread::id(), std::memory_order_relaxed);
    }

   private:
    NcclTensorBackend& backend_;
    std::unique_lock<std::mutex> lock_;
  };
  std::mutex launch_mutex_;
  std::atomic<bool> breaking_{false};        // set once the group is broken: calls stop settling
  std::atomic<bool> abort_deferred_{false};  // broken while a call was in flight: it aborts
  std::atomic<std::thread::id> caller_;      // the thread inside a CallScope, if any
  std::atomic<bool> aborted_{false};
  void abortOnce() {
    if (!aborted_.exchange(true)) ncclCommAbort(comm_);
  }
  ncclComm_t comm_ = nullptr;
  c10::Device device_{c10::kCUDA, 0};
  std::optional<c10::cuda::CUDAStream> stream_;  // the communication stream
  uint64_t next_seq_ = 1;

  std::mutex mutex_;  // guards what follows
  std::condition_variable wake_;
  std::deque<std::shared_ptr<NcclWork>> pending_;
  std::exception_ptr broken_;
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace ddprun::dist::nccl
