// Which GPUs a worker sees, as PCI addresses in CUDA's device order, so that the agent can
// place worker LOCAL_RANK near GPU LOCAL_RANK without loading CUDA.
//
// The GPUs of the host come from NVML (libnvidia-ml.so.1, opened at run time when present,
// never linked) or else from /proc/driver/nvidia/gpus/<bdf>/; both list them in PCI bus
// order, the order CUDA uses with CUDA_DEVICE_ORDER=PCI_BUS_ID. CUDA_VISIBLE_DEVICES then
// picks and reorders them: by index, or by UUID through NVML.
#pragma once

#include <string>
#include <vector>

#include "agent/placement/cpu_topology.h"

namespace ddprun::agent {

// The PCI addresses ("0000:3b:00.0", lower case) of the GPUs CUDA would number 0, 1, ...
// for a process with this environment; empty when there are none (or
// CUDA_VISIBLE_DEVICES hides them all). A fake topology root (CpuTopology::isRealHost()
// false) is read from <root>/proc/driver/nvidia/gpus/ only. Throws DdprunError naming
// CUDA_VISIBLE_DEVICES when an entry cannot be matched to a GPU, and naming NVML when it
// reports more than kMaxGpusPerNode GPUs (agent/placement/nvml_library.h).
std::vector<std::string> visibleGpuPciAddresses(const CpuTopology& topology);

}  // namespace ddprun::agent
