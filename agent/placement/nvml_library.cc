#include "agent/placement/nvml_library.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>

#include "common/env_names.h"
#include "common/text_escape.h"

namespace ddprun::agent {
namespace {

template <typename F>
void lookUp(void* handle, const char* name, F& f) {
  f = reinterpret_cast<F>(::dlsym(handle, name));
}

}  // namespace

std::string nvmlLibrary() {
  const char* library = std::getenv(env::kNvmlLibrary);
  return library && *library ? library : kDefaultNvmlLibrary;
}

std::string nvmlCountRefused(const std::string& library, unsigned count) {
  return fmt::format("NVML ({}) reports {} GPUs (more than {}): refusing", printable(library), count, kMaxGpusPerNode);
}

NvmlLibrary::NvmlLibrary(const std::string& library) {
  handle_ = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* error = ::dlerror();
    open_error_ = error ? error : library + ": cannot be opened";
    return;
  }
  NvmlFunctions& f = functions_;
  lookUp(handle_, "nvmlInit_v2", f.init);
  lookUp(handle_, "nvmlShutdown", f.shutdown);
  lookUp(handle_, "nvmlDeviceGetCount_v2", f.count);
  lookUp(handle_, "nvmlDeviceGetHandleByIndex_v2", f.by_index);
  lookUp(handle_, "nvmlDeviceGetHandleByUUID", f.by_uuid);
  lookUp(handle_, "nvmlErrorString", f.error_string);
  lookUp(handle_, "nvmlDeviceGetUUID", f.uuid);
  lookUp(handle_, "nvmlDeviceGetPciInfo_v3", f.pci);
  lookUp(handle_, "nvmlDeviceGetRetiredPagesPendingStatus", f.retired_pending);
  lookUp(handle_, "nvmlDeviceGetRemappedRows", f.remapped_rows);
}

NvmlLibrary::~NvmlLibrary() {
  stop();
  // NVML keeps no state past nvmlShutdown that we need; closing lets a test open another.
  if (handle_) ::dlclose(handle_);
}

int NvmlLibrary::start() {
  const int rc = functions_.init();
  started_ = rc == kNvmlSuccess;
  return rc;
}

void NvmlLibrary::stop() {
  if (started_) functions_.shutdown();
  started_ = false;
}

std::string NvmlLibrary::errorText(int rc) const {
  const char* text = functions_.error_string ? functions_.error_string(rc) : nullptr;
  return text ? fmt::format("{} (NVML error {})", printable(text), rc) : fmt::format("NVML error {}", rc);
}

}  // namespace ddprun::agent
