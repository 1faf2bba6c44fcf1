#include "agent/placement/gpu_health.h"

#include <string>

#include <catch2/catch.hpp>

#include "tests/support/scoped_env.h"

using namespace ddprun::agent;
using ddprun::testing::ScopedEnv;

// tests/support/fake_nvml.cc: GPU k is GPU-fa4e0000-0000-0000-0000-00000000000k on PCI bus 0x10 * (k + 1).
namespace {

struct FakeGpus {
  ScopedEnv count{"FAKE_NVML_COUNT", "3"};
  ScopedEnv lost{"FAKE_NVML_LOST", std::nullopt};
  ScopedEnv retired{"FAKE_NVML_RETIRED_PENDING", std::nullopt};
  ScopedEnv remap_pending{"FAKE_NVML_REMAP_PENDING", std::nullopt};
  ScopedEnv remap_failed{"FAKE_NVML_REMAP_FAILED", std::nullopt};
};

std::vector<std::string> kinds(const GpuHealth& h) {
  std::vector<std::string> out;
  for (const GpuProblem& p : h.problems) out.push_back(p.kind);
  return out;
}

}  // namespace

TEST_CASE("NVML names each GPU by index, UUID and PCI bus id", "[gpu_health]") {
  FakeGpus gpus;
  NvmlSession nvml(DDPRUN_FAKE_NVML);
  REQUIRE(nvml.ready());
  CHECK(nvml.count() == 3);
  const GpuIdentity gpu = nvml.identify(1);
  CHECK(gpu.index == 1);
  CHECK(gpu.uuid == "GPU-fa4e0000-0000-0000-0000-000000000001");
  CHECK(gpu.bus_id == "00000000:20:00.0");
  CHECK(gpu.bus == 0x20);
  CHECK(describeGpu(gpu) == "GPU 1 (GPU-fa4e0000-0000-0000-0000-000000000001, PCI 00000000:20:00.0)");
  CHECK(nvml.indexOfUuid("GPU-fa4e0000-0000-0000-0000-000000000002") == 2u);
  CHECK_FALSE(nvml.indexOfUuid("GPU-fa4e"));  // a prefix of every one: ambiguous
  CHECK_FALSE(nvml.indexOfUuid("GPU-ffff"));
}

TEST_CASE("a healthy GPU has no problem and every check was made", "[gpu_health]") {
  FakeGpus gpus;
  NvmlSession nvml(DDPRUN_FAKE_NVML);
  const GpuHealth h = nvml.health(0);
  CHECK_FALSE(h.sick());
  CHECK(h.unchecked.empty());
}

TEST_CASE("pending retired pages, pending or failed row remapping make a GPU sick", "[gpu_health]") {
  FakeGpus gpus;
  ScopedEnv retired("FAKE_NVML_RETIRED_PENDING", "1");
  ScopedEnv pending("FAKE_NVML_REMAP_PENDING", "2");
  ScopedEnv failed("FAKE_NVML_REMAP_FAILED", "0");
  NvmlSession nvml(DDPRUN_FAKE_NVML);
  CHECK(kinds(nvml.health(1)) == std::vector<std::string>{"retired_pages_pending"});
  CHECK(kinds(nvml.health(2)) == std::vector<std::string>{"remapped_rows_pending"});
  CHECK(kinds(nvml.health(0)) == std::vector<std::string>{"row_remapping_failed"});
  const GpuHealth h = nvml.health(1);
  CHECK(sickLine(h, "node7") ==
        "GPU 1 (GPU-fa4e0000-0000-0000-0000-000000000001, PCI 00000000:20:00.0) of host node7 is sick: memory pages "
        "are pending retirement (an uncorrectable ECC error; the GPU needs a reset)");
}

TEST_CASE("a lost GPU is sick, said once, and NVML cannot name it", "[gpu_health]") {
  FakeGpus gpus;
  ScopedEnv lost("FAKE_NVML_LOST", "2");
  NvmlSession nvml(DDPRUN_FAKE_NVML);
  const GpuHealth h = nvml.health(2);
  CHECK(kinds(h) == std::vector<std::string>{"gpu_lost"});
  CHECK(h.problems[0].text == "NVML says the GPU is lost (nvmlDeviceGetHandleByIndex_v2)");
  CHECK(h.gpu.uuid.empty());
  CHECK(describeGpu(h.gpu) == "GPU 2");
  CHECK_FALSE(nvml.health(1).sick());
}

TEST_CASE("an NVML without the health functions checks nothing and finds nothing sick", "[gpu_health]") {
  FakeGpus gpus;
  ScopedEnv retired("FAKE_NVML_RETIRED_PENDING", "0");
  NvmlSession nvml(DDPRUN_FAKE_NVML_OLD);
  REQUIRE(nvml.ready());
  const GpuHealth h = nvml.health(0);
  CHECK_FALSE(h.sick());
  CHECK(h.unchecked.size() == 2);
  CHECK(nvml.errorText(15) == "NVML error 15");
}

TEST_CASE("without NVML nothing is asked and the reason is kept", "[gpu_health]") {
  FakeGpus gpus;
  NvmlSession missing("/nonexistent/libnvidia-ml.so.1");
  CHECK_FALSE(missing.ready());
  CHECK(missing.problem().find("/nonexistent/libnvidia-ml.so.1") != std::string::npos);
  CHECK(missing.count() == 0);
  CHECK_FALSE(missing.health(0).sick());

  ScopedEnv failing("FAKE_NVML_COUNT", "fail");
  NvmlSession no_driver(DDPRUN_FAKE_NVML);
  CHECK_FALSE(no_driver.ready());
  CHECK(no_driver.problem() == "nvmlInit_v2 failed: Driver Not Loaded (NVML error 9)");
}

TEST_CASE("DDPRUN_NVML_LIBRARY names the NVML to open", "[gpu_health]") {
  {
    ScopedEnv unset("DDPRUN_NVML_LIBRARY", std::nullopt);
    CHECK(nvmlLibrary() == "libnvidia-ml.so.1");
  }
  ScopedEnv set("DDPRUN_NVML_LIBRARY", DDPRUN_FAKE_NVML);
  CHECK(nvmlLibrary() == DDPRUN_FAKE_NVML);
}

TEST_CASE("each local rank's GPU is entry LOCAL_RANK of CUDA_VISIBLE_DEVICES, or GPU LOCAL_RANK", "[gpu_health]") {
  FakeGpus gpus;
  NvmlSession nvml(DDPRUN_FAKE_NVML);
  auto indices = [&](const std::optional<std::string>& visible, int nproc) {
    std::vector<std::optional<unsigned>> out;
    for (const RankGpu& g : localRankGpus(nvml, visible, nproc)) out.push_back(g.index);
    return out;
  };
  using V = std::vector<std::optional<unsigned>>;
  // More ranks than GPUs: the last has none (a CPU job, or a job that shares GPUs).
  CHECK(indices(std::nullopt, 4) == V{0u, 1u, 2u, std::nullopt});
  CHECK(indices("2,0", 2) == V{2u, 0u});
  CHECK(indices("2, GPU-fa4e0000-0000-0000-0000-000000000001", 2) == V{2u, 1u});
  // CUDA stops at the first invalid entry; "" and "-1" hide every GPU.
  CHECK(indices("1,-1,0", 3) == V{1u, std::nullopt, std::nullopt});
  CHECK(indices("", 2) == V{std::nullopt, std::nullopt});
  CHECK(indices("7", 1) == V{std::nullopt});
  CHECK(indices("MIG-0c7d4a9b-a1b2-5c6d-8e9f-0123456789ab", 1) == V{std::nullopt});
  CHECK(distinctGpus(localRankGpus(nvml, "1,1,0", 3)) == std::vector<unsigned>{1, 0});
}

// An NVML that claims billions of GPUs once had every UUID lookup walk them all (minutes of
// NVML calls before a worker started): past kMaxGpusPerNode the session is not used at all.
TEST_CASE("an NVML that claims more than 1024 GPUs is refused with one line naming it", "[gpu_health][bad-input]") {
  FakeGpus gpus;
  for (const std::string count : {"4294967295", "2147483647", "4294967280", "1025"}) {
    ScopedEnv forged("FAKE_NVML_COUNT", count);
    NvmlSession nvml(DDPRUN_FAKE_NVML);
    CHECK_FALSE(nvml.ready());
    CHECK(nvml.refused());
    CHECK(nvml.problem() ==
          std::string("NVML (") + DDPRUN_FAKE_NVML + ") reports " + count + " GPUs (more than 1024): refusing");
    CHECK(nvml.count() == 0);
    CHECK_FALSE(nvml.indexOfUuid("GPU-1234"));
    CHECK(localRankGpus(nvml, "GPU-1234", 1).front().index == std::nullopt);
  }
  ScopedEnv most("FAKE_NVML_COUNT", "1024");
  NvmlSession nvml(DDPRUN_FAKE_NVML);
  CHECK(nvml.ready());
  CHECK_FALSE(nvml.refused());
  CHECK(nvml.count() == kMaxGpusPerNode);
  CHECK(nvml.indexOfUuid("GPU-fa4e0000-0000-0000-0000-0000000003ff") == 1023u);
}

TEST_CASE("NVML's strings are shown escaped in a GPU's name and its sick line", "[gpu_health][bad-input]") {
  FakeGpus gpus;
  ScopedEnv forged("FAKE_NVML_UUID0", "GPU-\x1b]0;PWN\x07\x1b[2J");
  ScopedEnv retired("FAKE_NVML_RETIRED_PENDING", "0");
  NvmlSession nvml(DDPRUN_FAKE_NVML);
  const GpuHealth h = nvml.health(0);
  CHECK(h.gpu.uuid == "GPU-\x1b]0;PWN\x07\x1b[2J");  // as NVML said it: matched against CUDA_VISIBLE_DEVICES
  CHECK(describeGpu(h.gpu) == "GPU 0 (GPU-\\x1b]0;PWN\\x07\\x1b[2J, PCI 00000000:10:00.0)");
  CHECK(sickLine(h, "node7") ==
        "GPU 0 (GPU-\\x1b]0;PWN\\x07\\x1b[2J, PCI 00000000:10:00.0) of host node7 is sick: memory pages are pending "
        "retirement (an uncorrectable ECC error; the GPU needs a reset)");
}
