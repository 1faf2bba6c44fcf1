#include "agent/placement/gpu_devices.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "agent/placement/nvml_session.h"
#include "common/env_names.h"
#include "common/error.h"

namespace ddprun::agent {
namespace {

// The few NVML declarations needed, so that building needs no NVIDIA headers.
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlPciInfo {  // nvmlPciInfo_t (v3)
  char bus_id_legacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pci_device_id;
  unsigned int pci_sub_system_id;
  char bus_id[32];
};

// NVML opened for one question and closed again: the agent asks once, at start.
class Nvml {
 public:
  Nvml() {
    lib_ = ::dlopen(nvmlLibrary().c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib_) return;
    init_ = reinterpret_cast<int (*)()>(::dlsym(lib_, "nvmlInit_v2"));
    shutdown_ = reinterpret_cast<int (*)()>(::dlsym(lib_, "nvmlShutdown"));
    count_ = reinterpret_cast<int (*)(unsigned*)>(::dlsym(lib_, "nvmlDeviceGetCount_v2"));
    by_index_ = reinterpret_cast<int (*)(unsigned, NvmlDevice*)>(::dlsym(lib_, "nvmlDeviceGetHandleByIndex_v2"));
    by_uuid_ = reinterpret_cast<int (*)(const char*, NvmlDevice*)>(::dlsym(lib_, "nvmlDeviceGetHandleByUUID"));
    pci_ = reinterpret_cast<int (*)(NvmlDevice, NvmlPciInfo*)>(::dlsym(lib_, "nvmlDeviceGetPciInfo_v3"));
    ready_ = init_ && shutdown_ && count_ && by_index_ && by_uuid_ && pci_ && init_() == 0;
  }
  ~Nvml() {
    if (ready_) shutdown_();
    if (lib_) ::dlclose(lib_);
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool ready() const { return ready_; }

  // The PCI addresses of every GPU, in NVML's order; nothing when NVML cannot say. Throws
  // DdprunError when NVML claims more than kMaxGpusPerNode: each would be asked for.
  std::optional<std::vector<std::string>> allDevices() const {
    unsigned count = 0;
    if (count_(&count) != 0) return std::nullopt;
    if (count > kMaxGpusPerNode) throw DdprunError(nvmlCountRefused(nvmlLibrary(), count));
    std::vector<std::string> addresses;
    for (unsigned i = 0; i < count; ++i) {
      NvmlDevice device = nullptr;
      auto address = by_index_(i, &device) == 0 ? pciAddress(device) : std::nullopt;
      if (!address) return std::nullopt;
      addresses.push_back(*address);
    }
    return addresses;
  }

  std::optional<std::string> deviceByUuid(const std::string& uuid) const {
    NvmlDevice device = nullptr;
    if (by_uuid_(uuid.c_str(), &device) != 0) return std::nullopt;
    return pciAddress(device);
  }

 private:
  std::optional<std::string> pciAddress(NvmlDevice device) const {
    NvmlPciInfo info{};
    if (pci_(device, &info) != 0) return std::nullopt;
    return fmt::format("{:04x}:{:02x}:{:02x}.0", info.domain, info.bus, info.device);
  }

  void* lib_ = nullptr;
  bool ready_ = false;
  int (*init_)() = nullptr;
  int (*shutdown_)() = nullptr;
  int (*count_)(unsigned*) = nullptr;
  int (*by_index_)(unsigned, NvmlDevice*) = nullptr;
  int (*by_uuid_)(const char*, NvmlDevice*) = nullptr;
  int (*pci_)(NvmlDevice, NvmlPciInfo*) = nullptr;
};

// The driver's own list: one directory per GPU, named by its PCI address.
std::vector<std::string> driverDevices(const std::string& root) {
  std::vector<std::string> addresses;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(root + "/proc/driver/nvidia/gpus", ec), end; !ec && it != end;
       it.increment(ec)) {
    std::string name = it->path().filename().string();
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    addresses.push_back(name);
  }
  std::sort(addresses.begin(), addresses.end());
  return addresses;
}

bool isIndex(std::string_view item) {
  return !item.empty() && std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::vector<std::string> visibleGpuPciAddresses(const CpuTopology& topology) {
  std::optional<Nvml> nvml;
  std::vector<std::string> all;
  if (topology.isRealHost()) {
    nvml.emplace();
    if (nvml->ready()) {
      if (auto devices = nvml->allDevices()) all = std::move(*devices);
    }
  }
  if (all.empty()) all = driverDevices(topology.root());

  const char* visible = std::getenv(env::kCudaVisibleDevices);
  if (!visible) return all;
  std::vector<std::string> picked;
  std::string_view list(visible);
  while (!list.empty()) {
    auto comma = list.find(',');
    std::string item(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    // CUDA stops at the first invalid entry ("-1" hides every device).
    if (item.empty() || item.front() == '-') break;
    if (isIndex(item)) {
      size_t index = 0;
      const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), index);
      if (ec != std::errc() || end != item.data() + item.size()) {
        throw DdprunError(std::string(env::kCudaVisibleDevices) + "='" + visible + "': device index " + item +
                          " is out of range");
      }
      if (index >= all.size()) break;
      picked.push_back(all[index]);
      continue;
    }
    std::optional<std::string> address = nvml && nvml->ready() ? nvml->deviceByUuid(item) : std::nullopt;
    if (!address) {
      throw DdprunError("CUDA_VISIBLE_DEVICES entry '" + item +
                        "' does not name a GPU that NVML (libnvidia-ml.so.1) "
                        "can find; use device indices");
    }
    picked.push_back(*address);
  }
  return picked;
}

}  // namespace ddprun::agent
