// Resolving --nproc_per_node's named values (auto, cpu, gpu, xpu) to a count without
// linking CUDA or any vendor library: ddprun must run on hosts that have no GPU stack.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "agent/placement/nvml_library.h"

namespace ddprun::launcher {

// Where device counts come from. fromHost() reads this process's environment and the real
// /proc and /sys; tests point the fields at fakes.
struct DeviceSources {
  std::optional<std::string> cuda_visible_devices;        // $CUDA_VISIBLE_DEVICES; unset: none.
  std::optional<std::string> ze_affinity_mask;            // $ZE_AFFINITY_MASK; unset: none.
  std::string nvml_library = agent::kDefaultNvmlLibrary;  // opened at run time when present.
  std::string proc_root = "/proc";                        // for driver/nvidia/gpus.
  std::string sys_root = "/sys";                          // for class/drm.

  static DeviceSources fromHost();
};

// NVIDIA GPUs this process may use: the entries of CUDA_VISIBLE_DEVICES when it is set
// (up to the first invalid one, as CUDA reads it), else NVML's device count, else the
// entries of /proc/driver/nvidia/gpus. 0 when there is no driver. Throws UsageError naming
// NVML when it reports more than agent::kMaxGpusPerNode GPUs (a broken or forged library).
int visibleGpuCount(const DeviceSources& sources = DeviceSources::fromHost());

// Intel GPUs (XPUs): the entries of ZE_AFFINITY_MASK when it is set and not empty, else
// the DRM render nodes (class/drm/renderD*) of vendor 0x8086 bound to the i915 or xe driver.
int visibleXpuCount(const DeviceSources& sources = DeviceSources::fromHost());

// Online CPUs.
int cpuCount();

// "auto" (NVIDIA GPUs if any, else XPUs if any, else CPUs), "cpu", "gpu", "xpu", or a
// positive integer, at most 65536 whichever it is. Throws UsageError for anything else, for
// "gpu" or "xpu" on a host without such devices, for a count over 65536, and for an NVML
// that reports more than agent::kMaxGpusPerNode GPUs.
int resolveNprocPerNode(std::string_view text, const DeviceSources& sources = DeviceSources::fromHost());

}  // namespace ddprun::launcher
