// What the agent asks NVML (agent/placement/nvml_library.h) about its GPUs: their names
// (index, UUID, PCI bus id) and their health. Only nvmlInit_v2, nvmlShutdown,
// nvmlDeviceGetCount_v2 and nvmlDeviceGetHandleByIndex_v2 are required; one of the other
// functions the driver lacks (older drivers have no row remapping, say) is a question not
// asked, never an error.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/placement/nvml_library.h"

namespace ddprun::agent {

struct GpuIdentity {
  unsigned index = 0;                        // NVML's index (PCI bus order)
  std::string uuid;                          // "GPU-8a7f..."; empty: NVML could not say
  std::string bus_id;                        // NVML's "00000000:3B:00.0"; empty: NVML could not say
  unsigned domain = 0, bus = 0, device = 0;  // valid when bus_id is not empty
};

// "GPU 0 (GPU-8a7f..., PCI 00000000:3B:00.0)", leaving out what NVML could not say; NVML's
// strings escaped (common/text_escape.h), as the driver's library is not to write to a terminal.
std::string describeGpu(const GpuIdentity& gpu);

struct GpuProblem {
  std::string kind;  // gpu_lost, nvml_error, retired_pages_pending, remapped_rows_pending, row_remapping_failed
  std::string text;  // for a log line: "NVML says the GPU is lost"
};

struct GpuHealth {
  GpuIdentity gpu;
  std::vector<GpuProblem> problems;    // empty: healthy, as far as NVML could tell
  std::vector<std::string> unchecked;  // checks not made: "retired pages (not supported)"
  bool sick() const { return !problems.empty(); }
};

// One NVML session: nvmlInit_v2 on construction, nvmlShutdown and dlclose on destruction.
// Each call is one or a few NVML calls (milliseconds; NVML may block while a GPU is being
// reset). Not thread-safe; never throws.
class NvmlSession {
 public:
  explicit NvmlSession(const std::string& library = nvmlLibrary());
  ~NvmlSession();
  NvmlSession(const NvmlSession&) = delete;
  NvmlSession& operator=(const NvmlSession&) = delete;

  // Opened and initialised, with the required functions, and a device count of at most
  // kMaxGpusPerNode.
  bool ready() const { return ready_; }
  // Not ready because NVML answered what no driver would (a count over kMaxGpusPerNode):
  // a host whose NVML is broken, which the caller tells the user of; not ready otherwise is
  // a host without NVML, which is common and no news.
  bool refused() const { return refused_; }
  // Why not ready ("libnvidia-ml.so.1: cannot open shared object file", "nvmlInit_v2
  // failed: Driver Not Loaded", nvmlCountRefused()); empty when ready.
  const std::string& problem() const { return problem_; }
  // The GPUs NVML sees (at most kMaxGpusPerNode); 0 when not ready or the count fails.
  unsigned count() const;
  // What NVML says of GPU `index`; the fields it cannot say stay empty.
  GpuIdentity identify(unsigned index) const;
  // Lost (NVML_ERROR_GPU_IS_LOST from any call, or no handle for an index below count()),
  // pending retired pages, pending or failed row remapping.
  GpuHealth health(unsigned index) const;
  // The index of the GPU whose UUID starts with `uuid` (CUDA_VISIBLE_DEVICES may shorten
  // it), when exactly one does. Asks NVML about each of count() GPUs.
  std::optional<unsigned> indexOfUuid(std::string_view uuid) const;
  // "GPU is lost (NVML error 15)", NVML's text escaped.
  std::string errorText(int rc) const;

 private:
  int handle(unsigned index, NvmlDevice* device) const;

  NvmlLibrary lib_;
  bool ready_ = false;
  bool refused_ = false;
  std::string problem_;
};

}  // namespace ddprun::agent
