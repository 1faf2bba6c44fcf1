#include "agent/placement/gpu_devices.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "agent/placement/nvml_library.h"
#include "common/env_names.h"
#include "common/error.h"

namespace ddprun::agent {
namespace {

// NVML asked one question and closed again: the agent asks once, at start. Every function
// used is required, else the GPUs come from the driver's list.
class Nvml {
 public:
  Nvml() : lib_(nvmlLibrary()) {
    if (!lib_.opened()) return;
    const NvmlFunctions& f = lib_.functions();
    ready_ = f.init && f.shutdown && f.count && f.by_index && f.by_uuid && f.pci && lib_.start() == kNvmlSuccess;
  }

  bool ready() const { return ready_; }

  // The PCI addresses of every GPU, in NVML's order; nothing when NVML cannot say. Throws
  // DdprunError when NVML claims more than kMaxGpusPerNode: each would be asked for.
  std::optional<std::vector<std::string>> allDevices() const {
    unsigned count = 0;
    if (lib_.functions().count(&count) != kNvmlSuccess) return std::nullopt;
    if (count > kMaxGpusPerNode) throw DdprunError(nvmlCountRefused(nvmlLibrary(), count));
    std::vector<std::string> addresses;
    for (unsigned i = 0; i < count; ++i) {
      NvmlDevice device = nullptr;
      auto address = lib_.functions().by_index(i, &device) == kNvmlSuccess ? pciAddress(device) : std::nullopt;
      if (!address) return std::nullopt;
      addresses.push_back(*address);
    }
    return addresses;
  }

  std::optional<std::string> deviceByUuid(const std::string& uuid) const {
    NvmlDevice device = nullptr;
    if (lib_.functions().by_uuid(uuid.c_str(), &device) != kNvmlSuccess) return std::nullopt;
    return pciAddress(device);
  }

 private:
  std::optional<std::string> pciAddress(NvmlDevice device) const {
    NvmlPciInfo info{};
    if (lib_.functions().pci(device, &info) != kNvmlSuccess) return std::nullopt;
    return fmt::format("{:04x}:{:02x}:{:02x}.0", info.domain, info.bus, info.device);
  }

  NvmlLibrary lib_;
  bool ready_ = false;
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
