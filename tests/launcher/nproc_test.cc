#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "common/error.h"
#include "launcher/nproc.h"
#include "tests/support/scoped_env.h"
#include "tests/support/test_process.h"

using ddprun::UsageError;
using ddprun::launcher::DeviceSources;
using ddprun::launcher::resolveNprocPerNode;
using ddprun::launcher::visibleGpuCount;
using ddprun::launcher::visibleXpuCount;
using ddprun::testing::ScopedEnv;
using ddprun::testing::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr const char* kNoNvml = "libddprun-test-no-such-nvml.so.1";

// A host with nothing: no CUDA_VISIBLE_DEVICES, no NVML, empty /proc and /sys.
DeviceSources emptyHost(const TempDir& dir) {
  DeviceSources s;
  s.nvml_library = kNoNvml;
  s.proc_root = dir.file("proc");
  s.sys_root = dir.file("sys");
  return s;
}

void addNvidiaProcEntries(const TempDir& dir, int n) {
  for (int i = 0; i < n; ++i) {
    fs::create_directories(dir.file("proc/driver/nvidia/gpus/0000:0" + std::to_string(i) + ":00.0"));
  }
}

// class/drm/<node>/device/{vendor,driver -> .../drivers/<driver>}, as sysfs shows a PCI GPU.
void addDrmNode(const TempDir& dir, const std::string& node, const std::string& vendor, const std::string& driver) {
  fs::path device = dir.file("sys/class/drm/" + node + "/device");
  fs::create_directories(device);
  std::ofstream(device / "vendor") << vendor << "\n";
  if (!driver.empty()) fs::create_symlink("../../../../bus/pci/drivers/" + driver, device / "driver");
}

std::string errorOf(std::string_view text, const DeviceSources& s) {
  try {
    resolveNprocPerNode(text, s);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("GPUs come from CUDA_VISIBLE_DEVICES then NVML then the driver's proc entries", "[nproc][unit]") {
  TempDir dir;
  DeviceSources s = emptyHost(dir);
  addNvidiaProcEntries(dir, 2);
  CHECK(visibleGpuCount(s) == 2);  // no NVML: /proc/driver/nvidia/gpus
  s.nvml_library = DDPRUN_FAKE_NVML;
  {
    ScopedEnv count("FAKE_NVML_COUNT", std::nullopt);
    CHECK(visibleGpuCount(s) == 3);
  }
  {
    ScopedEnv count("FAKE_NVML_COUNT", "8");
    CHECK(visibleGpuCount(s) == 8);
    s.cuda_visible_devices = "4,5,6";
    CHECK(visibleGpuCount(s) == 3);
    s.cuda_visible_devices = "0,-1,2";
    CHECK(visibleGpuCount(s) == 1);
    s.cuda_visible_devices = "";
    CHECK(visibleGpuCount(s) == 0);
  }
}

TEST_CASE("a missing or failing NVML is fine: the count comes from elsewhere", "[nproc][unit]") {
  TempDir dir;
  DeviceSources s = emptyHost(dir);
  CHECK(visibleGpuCount(s) == 0);
  CHECK_THAT(errorOf("gpu", s), Catch::Equals("--nproc_per_node=gpu: no GPU is visible on this host"));
  addNvidiaProcEntries(dir, 1);
  s.nvml_library = DDPRUN_FAKE_NVML;
  ScopedEnv failing("FAKE_NVML_COUNT", "fail");
  CHECK(visibleGpuCount(s) == 1);
  CHECK(resolveNprocPerNode("gpu", s) == 1);
}

TEST_CASE("DDPRUN_NVML_LIBRARY names the NVML that counts the host's GPUs", "[nproc][unit]") {
  ScopedEnv visible("CUDA_VISIBLE_DEVICES", std::nullopt);
  ScopedEnv count("FAKE_NVML_COUNT", "5");
  {
    ScopedEnv library("DDPRUN_NVML_LIBRARY", DDPRUN_FAKE_NVML);
    const DeviceSources s = DeviceSources::fromHost();
    CHECK(s.nvml_library == DDPRUN_FAKE_NVML);
    CHECK(visibleGpuCount(s) == 5);
  }
  ScopedEnv unset("DDPRUN_NVML_LIBRARY", std::nullopt);
  CHECK(DeviceSources::fromHost().nvml_library == "libnvidia-ml.so.1");
}

TEST_CASE("XPUs come from ZE_AFFINITY_MASK or else Intel render nodes in sysfs", "[nproc][unit]") {
  TempDir dir;
  DeviceSources s = emptyHost(dir);
  CHECK(visibleXpuCount(s) == 0);
  CHECK_THAT(errorOf("xpu", s), Catch::Equals("--nproc_per_node=xpu: no XPU is visible on this host"));
  addDrmNode(dir, "renderD128", "0x8086", "i915");
  addDrmNode(dir, "renderD129", "0x10de", "nvidia");  // not Intel
  addDrmNode(dir, "renderD130", "0x8086", "xe");
  addDrmNode(dir, "renderD131", "0x8086", "");  // no driver bound
  addDrmNode(dir, "card0", "0x8086", "i915");   // the same GPU's primary node
  CHECK(visibleXpuCount(s) == 2);
  CHECK(resolveNprocPerNode("xpu", s) == 2);
  s.ze_affinity_mask = "";  // empty: as if unset
  CHECK(visibleXpuCount(s) == 2);
  s.ze_affinity_mask = "0.0,0.1,1";
  CHECK(resolveNprocPerNode("xpu", s) == 3);
}

TEST_CASE("auto takes NVIDIA GPUs then XPUs then CPUs", "[nproc][unit]") {
  TempDir dir;
  DeviceSources s = emptyHost(dir);
  CHECK(resolveNprocPerNode("auto", s) == static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)));
  addDrmNode(dir, "renderD128", "0x8086", "xe");
  CHECK(resolveNprocPerNode("auto", s) == 1);
  s.cuda_visible_devices = "0,1";
  CHECK(resolveNprocPerNode("auto", s) == 2);
  CHECK_THAT(errorOf("tpu", s), Catch::Contains("auto, cpu, gpu or xpu"));
}

// A driver that answers nvmlDeviceGetCount_v2 with garbage: unsigned 2^32-1 once became -1
// (gpu resolved to -1 workers and waited forever) and 2^31-1 became 2,147,483,647 workers.
TEST_CASE("gpu and auto refuse an NVML that claims billions of GPUs, with one line naming it",
          "[nproc][unit][bad-input]") {
  TempDir dir;
  DeviceSources s = emptyHost(dir);
  s.nvml_library = DDPRUN_FAKE_NVML;
  for (const std::string count : {"4294967295", "2147483647", "4294967280", "1025"}) {
    ScopedEnv forged("FAKE_NVML_COUNT", count);
    for (const std::string value : {"gpu", "auto"}) {
      CHECK(errorOf(value, s) == "--nproc_per_node=" + value + ": NVML (" + DDPRUN_FAKE_NVML + ") reports " + count +
                                     " GPUs (more than 1024): refusing");
    }
  }
  ScopedEnv most("FAKE_NVML_COUNT", "1024");
  CHECK(resolveNprocPerNode("gpu", s) == 1024);
  CHECK(resolveNprocPerNode("auto", s) == 1024);
}

TEST_CASE("a named --nproc_per_node is bounded as a number is", "[nproc][unit][bad-input]") {
  TempDir dir;
  DeviceSources s = emptyHost(dir);
  std::string list = "0";
  for (int i = 1; i < 65537; ++i) list += ",0";
  s.cuda_visible_devices = list;
  CHECK(errorOf("gpu", s) == "--nproc_per_node=gpu: 65537 GPUs are visible, more than 65536 workers per node");
  CHECK(errorOf("auto", s) == "--nproc_per_node=auto: 65537 GPUs are visible, more than 65536 workers per node");
  s.cuda_visible_devices = std::nullopt;
  s.ze_affinity_mask = list;
  CHECK(errorOf("xpu", s) == "--nproc_per_node=xpu: 65537 XPUs are visible, more than 65536 workers per node");
}
