#include "launcher/nproc.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/error.h"
#include "launcher/parse_number.h"

namespace ddprun::launcher {

int visibleGpuCount() {
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::string_view list(visible);
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
  std::error_code ec;
  int count = 0;
  for (std::filesystem::directory_iterator it("/proc/driver/nvidia/gpus", ec), end; !ec && it != end;
       it.increment(ec)) {
    ++count;
  }
  return count;
}

int cpuCount() {
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

int resolveNprocPerNode(std::string_view text) {
  if (text == "cpu") return cpuCount();
  if (text == "auto") {
    int gpus = visibleGpuCount();
    return gpus > 0 ? gpus : cpuCount();
  }
  if (text == "gpu") {
    int gpus = visibleGpuCount();
    if (gpus == 0) throw UsageError("--nproc_per_node=gpu: no GPU is visible on this host");
    return gpus;
  }
  return parseInt("--nproc_per_node", text, 1, 1 << 16, "a positive integer, auto, cpu or gpu");
}

}  // namespace ddprun::launcher
