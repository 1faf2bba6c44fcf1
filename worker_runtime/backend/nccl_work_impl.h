// One op of an NCCL communicator as the caller holds it (a Work), and whether the GPU is done
// with it. The NCCL backend's insides (nccl_tensor_backend.h), built only against a
// CUDA-enabled LibTorch.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "worker_runtime/work.h"

namespace ddprun::dist::nccl {

using Clock = std::chrono::steady_clock;

// One op of the communicator: done when `end` (recorded on the communication stream after it)
// is, or failed by the watchdog.
class NcclWork final : public runtime::Work {
 public:
  NcclWork(std::string what, uint64_t seq, c10::Device device, bool blocks_host, std::vector<at::Tensor> keep)
      : what_(std::move(what)), seq_(seq), device_(device), blocks_host_(blocks_host), keep_(std::move(keep)) {}

  // Orders the caller's current stream after the op; barrier() also blocks the host until it
  // is done, as torch's does. Rethrows the watchdog's failure.
  void wait() override {
    if (blocks_host_) {
      while (!Work::isCompleted() && !end.query()) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    if (auto error = failure()) std::rethrow_exception(error);
    c10::cuda::CUDAGuard guard(device_);
    end.block(at::cuda::getCurrentCUDAStream(device_.index()));
  }
  bool isCompleted() const override { return Work::isCompleted() || end.query(); }
  bool isSuccess() const override { return isCompleted() && !failure(); }

  const std::string& what() const { return what_; }
  uint64_t seq() const { return seq_; }
  Clock::time_point issued() const { return issued_; }
  // The watchdog's: marks it done and lets go of its tensors.
  void settle(std::exception_ptr error) {
    keep_.clear();
    complete(std::move(error));
  }

  at::cuda::CUDAEvent end;

 private:
  std::string what_;
  uint64_t seq_;
  c10::Device device_;
  bool blocks_host_;
  Clock::time_point issued_ = Clock::now();
  std::vector<at::Tensor> keep_;  // alive until the GPU is done with them
};

// Whether `w`'s end event fired. A CUDA error instead (a lost device, the CUDA runtime already
// unloading at exit) is returned in `error`, not thrown: this runs on the watchdog thread and in
// the destructor, where an exception would end the process.
inline bool eventFired(const NcclWork& w, std::string& error) {
  try {
    return w.end.query();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    error = what.substr(0, what.find('\n'));
    return false;
  }
}

}  // namespace ddprun::dist::nccl
