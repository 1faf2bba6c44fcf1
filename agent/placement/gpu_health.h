// Which GPU each local rank is given, and whether those GPUs are fit to start on. ddprun, as
// torchrun, hands out GPUs by convention: worker LOCAL_RANK uses cuda:LOCAL_RANK, that is
// entry LOCAL_RANK of the agent's CUDA_VISIBLE_DEVICES (or GPU LOCAL_RANK without one); with
// --virtual_local_rank the worker's CUDA_VISIBLE_DEVICES is that same entry alone. NVML
// numbers GPUs in PCI bus order, as CUDA does with CUDA_DEVICE_ORDER=PCI_BUS_ID (the order
// agent/gpu_devices.h assumes too).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/placement/nvml_session.h"

namespace ddprun::agent {

struct RankGpu {
  int local_rank = 0;
  std::string entry;              // its CUDA_VISIBLE_DEVICES entry, or the index itself
  std::optional<unsigned> index;  // NVML's index; nothing: no GPU that NVML knows
};

// The GPU of each local rank 0..nproc-1, given the agent's CUDA_VISIBLE_DEVICES (nothing:
// unset). A rank has none when the list is too short or stops ("-1", an empty entry), when
// the index is not below session.count() (a CPU job with more ranks than GPUs), or when the
// entry is a UUID no GPU has, or a MIG instance (whose GPU NVML is not asked for). Never
// throws.
std::vector<RankGpu> localRankGpus(const NvmlSession& session, const std::optional<std::string>& cuda_visible,
                                   int nproc);

// The distinct NVML indices of `gpus`, in order.
std::vector<unsigned> distinctGpus(const std::vector<RankGpu>& gpus);

// "GPU 1 (GPU-..., PCI 00000000:3B:00.0) of host node7 is sick: <problem>; <problem>".
std::string sickLine(const GpuHealth& health, const std::string& host);

}  // namespace ddprun::agent
