#include "agent/placement/nvml_session.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "common/text_escape.h"

namespace ddprun::agent {

std::string describeGpu(const GpuIdentity& gpu) {
  std::string names;
  if (!gpu.uuid.empty()) names = printable(gpu.uuid);
  if (!gpu.bus_id.empty()) names += (names.empty() ? "PCI " : ", PCI ") + printable(gpu.bus_id);
  return names.empty() ? fmt::format("GPU {}", gpu.index) : fmt::format("GPU {} ({})", gpu.index, names);
}

NvmlSession::NvmlSession(const std::string& library) : lib_(library) {
  if (!lib_.opened()) {
    problem_ = lib_.openError();
    return;
  }
  const NvmlFunctions& f = lib_.functions();
  if (!f.init || !f.shutdown || !f.count || !f.by_index) {
    problem_ = library + " lacks nvmlInit_v2, nvmlShutdown, nvmlDeviceGetCount_v2 or nvmlDeviceGetHandleByIndex_v2";
    return;
  }
  if (const int rc = lib_.start(); rc != kNvmlSuccess) {
    problem_ = "nvmlInit_v2 failed: " + errorText(rc);
    return;
  }
  // Asked once: every later walk over the GPUs is bounded by what is checked here.
  if (unsigned n = 0; f.count(&n) == kNvmlSuccess && n > kMaxGpusPerNode) {
    problem_ = nvmlCountRefused(library, n);
    refused_ = true;
    lib_.stop();
    return;
  }
  ready_ = true;
}

// lib_ stops NVML and closes the library.
NvmlSession::~NvmlSession() = default;

std::string NvmlSession::errorText(int rc) const { return lib_.errorText(rc); }

unsigned NvmlSession::count() const {
  unsigned count = 0;
  if (!ready_ || lib_.functions().count(&count) != kNvmlSuccess) return 0;
  // NVML counts again on each call: a count that grew past the bound since is not walked either.
  return std::min(count, kMaxGpusPerNode);
}

int NvmlSession::handle(unsigned index, NvmlDevice* device) const {
  *device = nullptr;
  return lib_.functions().by_index(index, device);
}

GpuIdentity NvmlSession::identify(unsigned index) const {
  GpuIdentity gpu;
  gpu.index = index;
  const NvmlFunctions& f = lib_.functions();
  NvmlDevice device = nullptr;
  if (!ready_ || handle(index, &device) != kNvmlSuccess) return gpu;
  if (f.uuid) {
    char uuid[kNvmlUuidBuffer] = {};
    if (f.uuid(device, uuid, kNvmlUuidBuffer) == kNvmlSuccess) gpu.uuid.assign(uuid, ::strnlen(uuid, kNvmlUuidBuffer));
  }
  if (f.pci) {
    NvmlPciInfo info{};
    if (f.pci(device, &info) == kNvmlSuccess) {
      gpu.bus_id.assign(info.bus_id, ::strnlen(info.bus_id, sizeof info.bus_id));
      if (gpu.bus_id.empty()) gpu.bus_id = fmt::format("{:08X}:{:02X}:{:02X}.0", info.domain, info.bus, info.device);
      gpu.domain = info.domain;
      gpu.bus = info.bus;
      gpu.device = info.device;
    }
  }
  return gpu;
}

GpuHealth NvmlSession::health(unsigned index) const {
  GpuHealth h;
  h.gpu = identify(index);
  if (!ready_) return h;
  const NvmlFunctions& f = lib_.functions();
  auto lost = [&](const char* call) {
    h.problems.push_back(GpuProblem{"gpu_lost", fmt::format("NVML says the GPU is lost ({})", call)});
  };
  NvmlDevice device = nullptr;
  if (const int rc = handle(index, &device); rc != kNvmlSuccess) {
    if (rc == kNvmlGpuIsLost) {
      lost("nvmlDeviceGetHandleByIndex_v2");
    } else {
      h.problems.push_back(GpuProblem{"nvml_error", "NVML cannot open it: " + errorText(rc)});
    }
    return h;
  }
  if (f.retired_pending) {
    int pending = 0;
    const int rc = f.retired_pending(device, &pending);
    if (rc == kNvmlSuccess && pending == kNvmlEnabled) {
      h.problems.push_back(GpuProblem{"retired_pages_pending",
                                      "memory pages are pending retirement (an uncorrectable ECC error; the GPU "
                                      "needs a reset)"});
    } else if (rc == kNvmlGpuIsLost) {
      lost("nvmlDeviceGetRetiredPagesPendingStatus");
    } else if (rc != kNvmlSuccess) {
      h.unchecked.push_back("retired pages (" + errorText(rc) + ")");
    }
  } else {
    h.unchecked.push_back("retired pages (this NVML has no nvmlDeviceGetRetiredPagesPendingStatus)");
  }
  if (f.remapped_rows) {
    unsigned corrected = 0, uncorrected = 0, pending = 0, failed = 0;
    const int rc = f.remapped_rows(device, &corrected, &uncorrected, &pending, &failed);
    if (rc == kNvmlSuccess && failed != 0) {
      h.problems.push_back(
          GpuProblem{"row_remapping_failed", fmt::format("a memory row remapping failed ({} rows remapped for "
                                                         "uncorrectable errors, {} for correctable ones)",
                                                         uncorrected, corrected)});
    } else if (rc == kNvmlSuccess && pending != 0) {
      h.problems.push_back(
          GpuProblem{"remapped_rows_pending",
                     fmt::format("memory rows are pending remapping ({} rows remapped for uncorrectable errors, {} for "
                                 "correctable ones; the GPU needs a reset)",
                                 uncorrected, corrected)});
    } else if (rc == kNvmlGpuIsLost) {
      lost("nvmlDeviceGetRemappedRows");
    } else if (rc != kNvmlSuccess) {
      h.unchecked.push_back("remapped rows (" + errorText(rc) + ")");
    }
  } else {
    h.unchecked.push_back("remapped rows (this NVML has no nvmlDeviceGetRemappedRows)");
  }
  // Lost is said once, whichever call found it.
  bool said_lost = false;
  std::erase_if(h.problems, [&](const GpuProblem& p) {
    if (p.kind != "gpu_lost") return false;
    if (said_lost) return true;
    said_lost = true;
    return false;
  });
  return h;
}

std::optional<unsigned> NvmlSession::indexOfUuid(std::string_view uuid) const {
  std::optional<unsigned> found;
  const unsigned n = count();
  for (unsigned i = 0; i < n && !uuid.empty(); ++i) {
    const std::string name = identify(i).uuid;
    if (name.compare(0, uuid.size(), uuid) != 0) continue;
    if (found) return std::nullopt;  // ambiguous, as CUDA finds it
    found = i;
  }
  return found;
}

}  // namespace ddprun::agent
