#include "launcher/nvml_probe.h"

#include <dlfcn.h>

#include "common/logging.h"

namespace ddprun::launcher {
namespace {

// NVML's C ABI, from nvml.h: every call returns nvmlReturn_t, 0 meaning success.
using NvmlInit = int (*)();
using NvmlGetCount = int (*)(unsigned int*);
using NvmlShutdown = int (*)();

}  // namespace

std::optional<unsigned> nvmlDeviceCount(const std::string& library) {
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    logger("launcher")->debug("NVML not available ({}); counting GPUs without it", ::dlerror());
    return std::nullopt;
  }
  auto init = reinterpret_cast<NvmlInit>(::dlsym(handle, "nvmlInit_v2"));
  auto get_count = reinterpret_cast<NvmlGetCount>(::dlsym(handle, "nvmlDeviceGetCount_v2"));
  auto shutdown = reinterpret_cast<NvmlShutdown>(::dlsym(handle, "nvmlShutdown"));
  std::optional<unsigned> count;
  if (!init || !get_count || !shutdown) {
    logger("launcher")->debug("{} lacks the NVML functions ddprun needs; counting GPUs without it", library);
  } else if (int rc = init(); rc != 0) {
    logger("launcher")->debug("nvmlInit_v2 failed (NVML error {}); counting GPUs without it", rc);
  } else {
    unsigned int n = 0;
    if (int rc = get_count(&n); rc == 0) {
      count = n;
    } else {
      logger("launcher")->debug("nvmlDeviceGetCount_v2 failed (NVML error {})", rc);
    }
    shutdown();
  }
  // NVML keeps no state we need past nvmlShutdown; closing lets a test open another one.
  ::dlclose(handle);
  return count;
}

}  // namespace ddprun::launcher
