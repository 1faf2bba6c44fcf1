// NVML, the driver's libnvidia-ml.so.1, opened at run time and never linked, so that ddprun
// starts on hosts without a GPU stack: the one place ddprun loads it, for the launcher's GPU
// count (--nproc_per_node=gpu), the agent's placement and its GPU health. Building needs no
// NVIDIA headers: the few declarations ddprun uses are here, as nvml.h has them.
#pragma once

#include <string>

namespace ddprun::agent {

// The library the loader finds on every host with an NVIDIA driver.
inline constexpr const char* kDefaultNvmlLibrary = "libnvidia-ml.so.1";

// The most GPUs ddprun believes NVML about, in the agent (placement, health) and in
// --nproc_per_node=gpu/auto alike. A node has at most tens; a larger count is a broken or
// forged NVML, and walking it (4 billion indices for 0xffffffff) would hang the caller.
inline constexpr unsigned kMaxGpusPerNode = 1024;

// "NVML (<library>) reports <count> GPUs (more than 1024): refusing", the one line said of an
// NVML whose count is over kMaxGpusPerNode.
std::string nvmlCountRefused(const std::string& library, unsigned count);

// $DDPRUN_NVML_LIBRARY when set and not empty (a path or a name: a driver outside the
// loader's path, or the tests' fake NVML), else kDefaultNvmlLibrary.
std::string nvmlLibrary();

// nvmlReturn_t values ddprun tells apart.
inline constexpr int kNvmlSuccess = 0;
inline constexpr int kNvmlNotSupported = 3;
inline constexpr int kNvmlGpuIsLost = 15;
// NVML_DEVICE_UUID_V2_BUFFER_SIZE.
inline constexpr unsigned kNvmlUuidBuffer = 96;
// NVML_FEATURE_ENABLED.
inline constexpr int kNvmlEnabled = 1;

// nvmlDevice_t.
using NvmlDevice = struct NvmlDeviceOpaque*;

// nvmlPciInfo_t as nvmlDeviceGetPciInfo_v3 fills it.
struct NvmlPciInfo {
  char bus_id_legacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pci_device_id;
  unsigned int pci_sub_system_id;
  char bus_id[32];
};

// The NVML functions ddprun calls, each null when the library lacks it (older drivers have no
// row remapping, say): which of them a caller requires is the caller's to say.
struct NvmlFunctions {
  int (*init)() = nullptr;                             // nvmlInit_v2
  int (*shutdown)() = nullptr;                         // nvmlShutdown
  int (*count)(unsigned*) = nullptr;                   // nvmlDeviceGetCount_v2
  int (*by_index)(unsigned, NvmlDevice*) = nullptr;    // nvmlDeviceGetHandleByIndex_v2
  int (*by_uuid)(const char*, NvmlDevice*) = nullptr;  // nvmlDeviceGetHandleByUUID
  const char* (*error_string)(int) = nullptr;          // nvmlErrorString
  int (*uuid)(NvmlDevice, char*, unsigned) = nullptr;  // nvmlDeviceGetUUID
  int (*pci)(NvmlDevice, NvmlPciInfo*) = nullptr;      // nvmlDeviceGetPciInfo_v3
  int (*retired_pending)(NvmlDevice, int*) = nullptr;  // nvmlDeviceGetRetiredPagesPendingStatus
  int (*remapped_rows)(NvmlDevice, unsigned*, unsigned*, unsigned*, unsigned*) = nullptr;  // nvmlDeviceGetRemappedRows
};

// The library opened (dlopen) with its functions looked up; NVML started (nvmlInit_v2) when
// the caller asks, stopped (nvmlShutdown) and the library closed on destruction. Never throws;
// not thread-safe.
class NvmlLibrary {
 public:
  // Opens `library`: a name for the loader's search or a path.
  explicit NvmlLibrary(const std::string& library);
  ~NvmlLibrary();
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  bool opened() const { return handle_ != nullptr; }
  // The loader's reason when not opened ("libnvidia-ml.so.1: cannot open shared object file").
  const std::string& openError() const { return open_error_; }
  const NvmlFunctions& functions() const { return functions_; }

  // nvmlInit_v2's result; on success nvmlShutdown is called by stop() or the destructor.
  // Requires functions().init and functions().shutdown.
  int start();
  // nvmlShutdown, when started and not stopped yet.
  void stop();

  // "GPU is lost (NVML error 15)", NVML's own text escaped (common/text_escape.h), as the
  // driver's library is not to write to a terminal; "NVML error 15" when it has no text.
  std::string errorText(int rc) const;

 private:
  void* handle_ = nullptr;
  std::string open_error_;
  NvmlFunctions functions_;
  bool started_ = false;
};

}  // namespace ddprun::agent
