#include "launcher/nproc.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "agent/placement/nvml_library.h"
#include "common/env_names.h"
#include "common/env_reader.h"
#include "common/error.h"
#include "common/logging.h"
#include "launcher/parse_number.h"

namespace ddprun::launcher {
namespace fs = std::filesystem;
namespace {

// The most workers one node runs, however --nproc_per_node names them.
constexpr int kMaxWorkers = 1 << 16;

int countCudaVisibleDevices(std::string_view list) {
  int count = 0;
  while (!list.empty()) {
    auto comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    // CUDA stops at the first invalid entry ("-1" hides every device).
    if (item.empty() || item.front() == '-') break;
    ++count;
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
  }
  return count;
}

int countEntries(const fs::path& dir) {
  std::error_code ec;
  int count = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) ++count;
  return count;
}

std::string firstLine(const fs::path& file) {
  std::string line;
  std::ifstream in(file);
  std::getline(in, line);
  return line;
}

// nvmlDeviceGetCount_v2 between nvmlInit_v2 and nvmlShutdown, as NVML says it: any unsigned
// value, which the caller bounds. Nothing when the library is missing, lacks those functions,
// or NVML fails (no driver loaded): the caller falls back to another source. Blocks while
// NVML initialises (milliseconds).
std::optional<unsigned> nvmlDeviceCount(const std::string& library) {
  agent::NvmlLibrary nvml(library);
  if (!nvml.opened()) {
    logger("launcher")->debug("NVML not available ({}); counting GPUs without it", nvml.openError());
    return std::nullopt;
  }
  const agent::NvmlFunctions& f = nvml.functions();
  if (!f.init || !f.count || !f.shutdown) {
    logger("launcher")->debug("{} lacks the NVML functions ddprun needs; counting GPUs without it", library);
    return std::nullopt;
  }
  if (int rc = nvml.start(); rc != agent::kNvmlSuccess) {
    logger("launcher")->debug("nvmlInit_v2 failed (NVML error {}); counting GPUs without it", rc);
    return std::nullopt;
  }
  unsigned int n = 0;
  if (int rc = f.count(&n); rc != agent::kNvmlSuccess) {
    logger("launcher")->debug("nvmlDeviceGetCount_v2 failed (NVML error {})", rc);
    return std::nullopt;
  }
  return n;
}

// An Intel GPU shows as one render node whose PCI device has vendor 0x8086 and one of
// Intel's GPU drivers bound; render nodes of other vendors and unbound devices are skipped.
bool isIntelGpuRenderNode(const fs::path& node) {
  if (firstLine(node / "device" / "vendor") != "0x8086") return false;
  std::error_code ec;
  std::string driver = fs::read_symlink(node / "device" / "driver", ec).filename().string();
  return !ec && (driver == "i915" || driver == "xe");
}

}  // namespace

DeviceSources DeviceSources::fromHost() {
  DeviceSources sources;
  // Raw: an empty list is a list that hides every device, not an unset variable.
  sources.cuda_visible_devices = env::raw(env::kCudaVisibleDevices);
  sources.ze_affinity_mask = env::raw(env::kZeAffinityMask);
  if (std::optional<std::string> library = env::raw(env::kNvmlLibrary); library && !library->empty()) {
    sources.nvml_library = *library;
  }
  return sources;
}

int visibleGpuCount(const DeviceSources& sources) {
  if (sources.cuda_visible_devices) return countCudaVisibleDevices(*sources.cuda_visible_devices);
  if (std::optional<unsigned> count = nvmlDeviceCount(sources.nvml_library)) {
    // A broken or forged NVML's 0xffffffff would be -1 workers as an int, 0x7fffffff two billion.
    if (*count > agent::kMaxGpusPerNode) throw UsageError(agent::nvmlCountRefused(sources.nvml_library, *count));
    return static_cast<int>(*count);
  }
  return countEntries(fs::path(sources.proc_root) / "driver/nvidia/gpus");
}

int visibleXpuCount(const DeviceSources& sources) {
  // Level Zero treats an empty mask like none; each entry is a device or one of its tiles,
  // and torch.xpu counts either as a device.
  if (sources.ze_affinity_mask && !sources.ze_affinity_mask->empty()) {
    int count = 0;
    std::string_view rest = *sources.ze_affinity_mask;
    while (true) {
      auto comma = rest.find(',');
      if (!rest.substr(0, comma).empty()) ++count;
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    return count;
  }
  std::error_code ec;
  int count = 0;
  for (fs::directory_iterator it(fs::path(sources.sys_root) / "class/drm", ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it->path().filename().string().rfind("renderD", 0) == 0 && isIntelGpuRenderNode(it->path())) ++count;
  }
  return count;
}

int cpuCount() {
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

int resolveNprocPerNode(std::string_view text, const DeviceSources& sources) {
  // A named count is bounded as a number is, and its errors say which name it was.
  auto bounded = [&](int count, const char* devices) {
    if (count > kMaxWorkers) {
      throw UsageError(fmt::format("--nproc_per_node={}: {} {} are visible, more than {} workers per node", text, count,
                                   devices, kMaxWorkers));
    }
    return count;
  };
  auto gpus = [&] {
    try {
      return visibleGpuCount(sources);
    } catch (const UsageError& e) {
      throw UsageError(fmt::format("--nproc_per_node={}: {}", text, e.what()));
    }
  };
  if (text == "cpu") return bounded(cpuCount(), "CPUs");
  if (text == "auto") {
    // torchrun's auto takes whichever accelerator torch finds, else the CPUs.
    if (int n = gpus(); n > 0) return bounded(n, "GPUs");
    if (int n = visibleXpuCount(sources); n > 0) return bounded(n, "XPUs");
    return bounded(cpuCount(), "CPUs");
  }
  if (text == "gpu") {
    const int n = gpus();
    if (n == 0) throw UsageError("--nproc_per_node=gpu: no GPU is visible on this host");
    return bounded(n, "GPUs");
  }
  if (text == "xpu") {
    const int n = visibleXpuCount(sources);
    if (n == 0) throw UsageError("--nproc_per_node=xpu: no XPU is visible on this host");
    return bounded(n, "XPUs");
  }
  return parseInt("--nproc_per_node", text, 1, kMaxWorkers, "a positive integer, auto, cpu, gpu or xpu");
}

}  // namespace ddprun::launcher
