// The default generators' states that a checkpoint carries (checkpoint.h).
#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

#include "worker_runtime/checkpoint/checkpoint.h"

namespace ddprun::checkpoint {

at::Tensor cpuRngState() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void setCpuRngState(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state.to(at::kCPU));
}

// Through at::Context's device-generic generators, so this file needs no CUDA headers (and a
// CPU-only LibTorch reports no device).
at::Tensor cudaRngState() {
  const auto devices = static_cast<int>(at::getNumGPUs());
  std::vector<at::Tensor> states;
  for (int d = 0; d < devices; ++d) {
    at::Generator gen = at::globalContext().defaultGenerator(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(d)));
    std::lock_guard<std::mutex> lock(gen.mutex());
    states.push_back(gen.get_state());
  }
  return states.empty() ? at::empty({0}, at::kByte) : at::cat(states);
}

bool setCudaRngState(const at::Tensor& state) {
  const auto devices = static_cast<int>(at::getNumGPUs());
  if (devices == 0 || state.numel() == 0 || state.numel() % devices != 0) return false;
  const int64_t each = state.numel() / devices;
  for (int d = 0; d < devices; ++d) {
    at::Generator gen = at::globalContext().defaultGenerator(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(d)));
    std::lock_guard<std::mutex> lock(gen.mutex());
    if (gen.get_state().numel() != each) return false;
    gen.set_state(state.narrow(0, d * each, each).to(at::kCPU).contiguous());
  }
  return true;
}

}  // namespace ddprun::checkpoint
