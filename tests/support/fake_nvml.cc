// A stand-in for libnvidia-ml.so.1 with the three functions ddprun opens: it reports
// $FAKE_NVML_COUNT devices (default 3), or fails nvmlInit_v2 with NVML's "driver not
// loaded" (9) when that variable is "fail".
#include <charconv>
#include <cstdlib>
#include <cstring>

extern "C" {

int nvmlInit_v2() {
  const char* count = std::getenv("FAKE_NVML_COUNT");
  return count && std::strcmp(count, "fail") == 0 ? 9 : 0;
}

int nvmlDeviceGetCount_v2(unsigned int* count) {
  const char* text = std::getenv("FAKE_NVML_COUNT");
  *count = 3;
  if (text) {
    const char* end = text + std::strlen(text);
    if (std::from_chars(text, end, *count).ptr != end) return 1;  // NVML_ERROR_UNINITIALIZED
  }
  return 0;
}

int nvmlShutdown() { return 0; }

}  // extern "C"
