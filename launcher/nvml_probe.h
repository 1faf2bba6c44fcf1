// Counting NVIDIA GPUs through NVML without linking it: the library is opened at run time
// where the driver installed it, so ddprun still starts on hosts without a GPU stack.
#pragma once

#include <optional>
#include <string>

namespace ddprun::launcher {

// The driver's NVML, as the dynamic loader finds it.
inline constexpr const char* kNvmlLibrary = "libnvidia-ml.so.1";

// Opens `library` (a name for the loader's search or a path), and returns
// nvmlDeviceGetCount_v2 between nvmlInit_v2 and nvmlShutdown, as NVML says it: any unsigned
// value, which the caller bounds (kMaxGpusPerNode). Nothing when the library is missing,
// lacks those symbols, or NVML fails (no driver loaded): the caller falls back to another
// source. Blocks while NVML initialises (milliseconds); never throws.
std::optional<unsigned> nvmlDeviceCount(const std::string& library = kNvmlLibrary);

}  // namespace ddprun::launcher
