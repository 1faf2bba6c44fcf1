// A stand-in for libnvidia-ml.so.1, opened at run time like the driver's (DDPRUN_NVML_LIBRARY
// points ddprun at it). Its answers come from the environment of the process that opens it:
//   FAKE_NVML_COUNT           the number of GPUs (default 3), any 32-bit count (4294967295 too:
//                             a broken driver's); "fail": nvmlInit_v2 fails with NVML's "driver
//                             not loaded" (9)
//   FAKE_NVML_UUID0           GPU 0's UUID instead of the one below (a hostile driver's string)
//   FAKE_NVML_LOST            GPUs (indices, comma-separated) that are lost: every call on
//                             them returns NVML_ERROR_GPU_IS_LOST (15)
//   FAKE_NVML_RETIRED_PENDING GPUs with retired pages pending
//   FAKE_NVML_REMAP_PENDING   GPUs with row remapping pending
//   FAKE_NVML_REMAP_FAILED    GPUs whose row remapping failed
// GPU k has UUID GPU-fa4e0000-0000-0000-0000-00000000000k and PCI bus id 00000000:k1:00.0
// (bus 0x10 * (k + 1)). Built twice: FAKE_NVML_OLD leaves out nvmlErrorString and the health
// functions, as an older driver's NVML lacks them.
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace {

constexpr int kSuccess = 0;
constexpr int kUninitialized = 1;
constexpr int kInvalidArgument = 2;
constexpr int kDriverNotLoaded = 9;
constexpr int kGpuIsLost = 15;

using Device = void*;

// Whether `index` is in the comma-separated list in variable `name`.
bool listed(const char* name, unsigned index) {
  const char* text = std::getenv(name);
  if (!text) return false;
  std::string_view rest(text);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    unsigned value = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (ec == std::errc() && end == item.data() + item.size() && value == index) return true;
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  return false;
}

// GPU k's UUID; FAKE_NVML_UUID0 replaces GPU 0's.
void uuidOf(unsigned index, char* uuid, unsigned length) {
  const char* forged = std::getenv("FAKE_NVML_UUID0");
  if (index == 0 && forged) {
    std::snprintf(uuid, length, "%s", forged);
  } else {
    std::snprintf(uuid, length, "GPU-fa4e0000-0000-0000-0000-%012x", index);
  }
}

int count(unsigned* out) {
  const char* text = std::getenv("FAKE_NVML_COUNT");
  *out = 3;
  if (text) {
    const char* end = text + std::strlen(text);
    if (std::from_chars(text, end, *out).ptr != end) return kUninitialized;
  }
  return kSuccess;
}

// Handles are index + 1, so that no handle is null.
Device handleOf(unsigned index) { return reinterpret_cast<Device>(static_cast<uintptr_t>(index) + 1); }
unsigned indexOf(Device device) { return static_cast<unsigned>(reinterpret_cast<uintptr_t>(device) - 1); }

struct PciInfo {  // nvmlPciInfo_t (v3)
  char bus_id_legacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pci_device_id;
  unsigned int pci_sub_system_id;
  char bus_id[32];
};

}  // namespace

extern "C" {

int nvmlInit_v2() {
  const char* count = std::getenv("FAKE_NVML_COUNT");
  return count && std::strcmp(count, "fail") == 0 ? kDriverNotLoaded : kSuccess;
}

int nvmlShutdown() { return kSuccess; }

int nvmlDeviceGetCount_v2(unsigned int* out) { return count(out); }

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, Device* device) {
  unsigned n = 0;
  if (count(&n) != kSuccess) return kUninitialized;
  if (index >= n) return kInvalidArgument;
  if (listed("FAKE_NVML_LOST", index)) return kGpuIsLost;
  *device = handleOf(index);
  return kSuccess;
}

int nvmlDeviceGetUUID(Device device, char* uuid, unsigned int length) {
  const unsigned index = indexOf(device);
  if (listed("FAKE_NVML_LOST", index)) return kGpuIsLost;
  uuidOf(index, uuid, length);
  return kSuccess;
}

int nvmlDeviceGetHandleByUUID(const char* uuid, Device* device) {
  unsigned n = 0;
  if (count(&n) != kSuccess) return kUninitialized;
  // Read the index out of the UUID rather than walk the GPUs: a test's count may be 2^32-1.
  char name[96];
  uuidOf(0, name, sizeof name);
  unsigned index = 0;
  if (std::strcmp(name, uuid) != 0) {
    constexpr std::string_view kPrefix = "GPU-fa4e0000-0000-0000-0000-";
    const std::string_view text(uuid);
    if (text.size() != kPrefix.size() + 12 || text.substr(0, kPrefix.size()) != kPrefix) return kInvalidArgument;
    const char* hex = uuid + kPrefix.size();
    const auto [end, ec] = std::from_chars(hex, hex + 12, index, 16);
    if (ec != std::errc() || end != hex + 12) return kInvalidArgument;
    uuidOf(index, name, sizeof name);
    if (std::strcmp(name, uuid) != 0) return kInvalidArgument;  // GPU 0 renamed, or upper case
  }
  if (index >= n) return kInvalidArgument;
  *device = handleOf(index);
  return kSuccess;
}

int nvmlDeviceGetPciInfo_v3(Device device, PciInfo* info) {
  const unsigned index = indexOf(device);
  if (listed("FAKE_NVML_LOST", index)) return kGpuIsLost;
  *info = PciInfo{};
  info->domain = 0;
  info->bus = 0x10 * (index + 1);
  info->device = 0;
  std::snprintf(info->bus_id, sizeof info->bus_id, "%08X:%02X:00.0", info->domain, info->bus);
  std::snprintf(info->bus_id_legacy, sizeof info->bus_id_legacy, "%04X:%02X:00.0", info->domain, info->bus);
  return kSuccess;
}

#ifndef FAKE_NVML_OLD
const char* nvmlErrorString(int result) {
  switch (result) {
    case kSuccess: return "Success";
    case kUninitialized: return "Uninitialized";
    case kInvalidArgument: return "Invalid Argument";
    case kDriverNotLoaded: return "Driver Not Loaded";
    case kGpuIsLost: return "GPU is lost";
    default: return "Unknown Error";
  }
}

int nvmlDeviceGetRetiredPagesPendingStatus(Device device, int* pending) {
  const unsigned index = indexOf(device);
  if (listed("FAKE_NVML_LOST", index)) return kGpuIsLost;
  *pending = listed("FAKE_NVML_RETIRED_PENDING", index) ? 1 : 0;
  return kSuccess;
}

int nvmlDeviceGetRemappedRows(Device device, unsigned int* corrected, unsigned int* uncorrected, unsigned int* pending,
                              unsigned int* failed) {
  const unsigned index = indexOf(device);
  if (listed("FAKE_NVML_LOST", index)) return kGpuIsLost;
  *pending = listed("FAKE_NVML_REMAP_PENDING", index) ? 1 : 0;
  *failed = listed("FAKE_NVML_REMAP_FAILED", index) ? 1 : 0;
  *corrected = 0;
  *uncorrected = *pending + *failed;
  return kSuccess;
}
#endif

}  // extern "C"
