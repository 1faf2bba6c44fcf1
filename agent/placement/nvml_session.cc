#include "agent/placement/nvml_session.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/env_names.h"
#include "common/text_escape.h"

namespace ddprun::agent {
namespace {

// nvmlPciInfo_t as nvmlDeviceGetPciInfo_v3 fills it; declared here so that building needs
// no NVIDIA headers.
struct NvmlPciInfo {
  char bus_id_legacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pci_device_id;
  unsigned int pci_sub_system_id;
  char bus_id[32];
};

// NVML_DEVICE_UUID_V2_BUFFER_SIZE.
constexpr unsigned kUuidBuffer = 96;
// NVML_FEATURE_ENABLED.
constexpr int kNvmlEnabled = 1;

template <typename F>
void lookUp(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(::dlsym(lib, name));
}

}  // namespace

std::string nvmlLibrary() {
  const char* library = std::getenv(env::kNvmlLibrary);
  return library && *library ? library : kDefaultNvmlLibrary;
}

std::string nvmlCountRefused(const std::string& library, unsigned count) {
  return fmt::format("NVML ({}) reports {} GPUs (more than {}): refusing", printable(library), count, kMaxGpusPerNode);
}

std::string describeGpu(const GpuIdentity& gpu) {
  std::string names;
  if (!gpu.uuid.empty()) names = printable(gpu.uuid);
  if (!gpu.bus_id.empty()) names += (names.empty() ? "PCI " : ", PCI ") + printable(gpu.bus_id);
  return names.empty() ? fmt::format("GPU {}", gpu.index) : fmt::format("GPU {} ({})", gpu.index, names);
}

NvmlSession::NvmlSession(const std::string& library) {
  lib_ = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib_) {
    const char* error = ::dlerror();
    problem_ = error ? error : library + ": cannot be opened";
    return;
  }
  lookUp(lib_, "nvmlInit_v2", init_);
  lookUp(lib_, "nvmlShutdown", shutdown_);
  lookUp(lib_, "nvmlDeviceGetCount_v2", count_);
  lookUp(lib_, "nvmlDeviceGetHandleByIndex_v2", by_index_);
  lookUp(lib_, "nvmlErrorString", error_string_);
  lookUp(lib_, "nvmlDeviceGetUUID", uuid_);
  lookUp(lib_, "nvmlDeviceGetPciInfo_v3", pci_);
  lookUp(lib_, "nvmlDeviceGetRetiredPagesPendingStatus", retired_pending_);
  lookUp(lib_, "nvmlDeviceGetRemappedRows", remapped_rows_);
  if (!init_ || !shutdown_ || !count_ || !by_index_) {
    problem_ = library + " lacks nvmlInit_v2, nvmlShutdown, nvmlDeviceGetCount_v2 or nvmlDeviceGetHandleByIndex_v2";
    return;
  }
  if (const int rc = init_(); rc != kNvmlSuccess) {
    problem_ = "nvmlInit_v2 failed: " + errorText(rc);
    return;
  }
  // Asked once: every later walk over the GPUs is bounded by what is checked here.
  if (unsigned n = 0; count_(&n) == kNvmlSuccess && n > kMaxGpusPerNode) {
    problem_ = nvmlCountRefused(library, n);
    refused_ = true;
    shutdown_();
    return;
  }
  ready_ = true;
}

NvmlSession::~NvmlSession() {
  if (ready_) shutdown_();
  // NVML keeps no state past nvmlShutdown that we need; closing lets a test open another.
  if (lib_) ::dlclose(lib_);
}

std::string NvmlSession::errorText(int rc) const {
  const char* text = error_string_ ? error_string_(rc) : nullptr;
  return text ? fmt::format("{} (NVML error {})", printable(text), rc) : fmt::format("NVML error {}", rc);
}

unsigned NvmlSession::count() const {
  unsigned count = 0;
  if (!ready_ || count_(&count) != kNvmlSuccess) return 0;
  // NVML counts again on each call: a count that grew past the bound since is not walked either.
  return std::min(count, kMaxGpusPerNode);
}

int NvmlSession::handle(unsigned index, Device** device) const {
  *device = nullptr;
  return by_index_(index, device);
}

GpuIdentity NvmlSession::identify(unsigned index) const {
  GpuIdentity gpu;
  gpu.index = index;
  Device* device = nullptr;
  if (!ready_ || handle(index, &device) != kNvmlSuccess) return gpu;
  if (uuid_) {
    char uuid[kUuidBuffer] = {};
    if (uuid_(device, uuid, kUuidBuffer) == kNvmlSuccess) gpu.uuid.assign(uuid, ::strnlen(uuid, kUuidBuffer));
  }
  if (pci_) {
    NvmlPciInfo info{};
    if (pci_(device, &info) == kNvmlSuccess) {
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
  auto lost = [&](const char* call) {
    h.problems.push_back(GpuProblem{"gpu_lost", fmt::format("NVML says the GPU is lost ({})", call)});
  };
  Device* device = nullptr;
  if (const int rc = handle(index, &device); rc != kNvmlSuccess) {
    if (rc == kNvmlGpuIsLost) {
      lost("nvmlDeviceGetHandleByIndex_v2");
    } else {
      h.problems.push_back(GpuProblem{"nvml_error", "NVML cannot open it: " + errorText(rc)});
    }
    return h;
  }
  if (retired_pending_) {
    int pending = 0;
    const int rc = retired_pending_(device, &pending);
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
  if (remapped_rows_) {
    unsigned corrected = 0, uncorrected = 0, pending = 0, failed = 0;
    const int rc = remapped_rows_(device, &corrected, &uncorrected, &pending, &failed);
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
