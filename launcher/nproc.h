// Resolving --nproc_per_node's named values (auto, cpu, gpu) to a count without linking
// CUDA: ddprun must run on hosts that have no GPU stack at all.
#pragma once

#include <string_view>

namespace ddprun::launcher {

// GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else the NVIDIA driver's
// device list. 0 when there is no driver.
int visibleGpuCount();

// Online CPUs.
int cpuCount();

// "auto" (GPUs if any, else CPUs), "cpu", "gpu", or a positive integer. Throws
// UsageError for anything else, and for "gpu" on a host without GPUs.
int resolveNprocPerNode(std::string_view text);

}  // namespace ddprun::launcher
