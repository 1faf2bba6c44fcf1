#include "agent/placement/gpu_watch.h"

#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/support/scoped_env.h"
#include "tests/support/test_process.h"

using namespace ddprun::agent;
using ddprun::JsonObject;
using ddprun::testing::ScopedEnv;
using ddprun::testing::TempDir;

// tests/support/fake_nvml.cc: GPU k is GPU-fa4e0000-0000-0000-0000-00000000000k on PCI bus 0x10 * (k + 1).
namespace {

struct Watched {
  ScopedEnv count{"FAKE_NVML_COUNT", "3"};
  ScopedEnv lost{"FAKE_NVML_LOST", std::nullopt};
  ScopedEnv retired{"FAKE_NVML_RETIRED_PENDING", std::nullopt};
  ScopedEnv remap_pending{"FAKE_NVML_REMAP_PENDING", std::nullopt};
  ScopedEnv remap_failed{"FAKE_NVML_REMAP_FAILED", std::nullopt};
  TempDir dir;
  std::vector<std::string> events;  // "event json"

  std::string kmsg() const { return dir.file("kmsg"); }
  GpuWatch watch(std::optional<std::string> visible, int nproc = 2, std::string library = DDPRUN_FAKE_NVML) {
    std::ofstream(kmsg(), std::ios::app);
    GpuWatch::Options options;
    options.host = "node7";
    options.nproc_per_node = nproc;
    options.cuda_visible_devices = std::move(visible);
    options.nvml_library = std::move(library);
    options.kernel_log = kmsg();
    return GpuWatch(std::move(options),
                    [this](const std::string& e, const JsonObject& f) { events.push_back(e + " " + f.str()); });
  }
};

WorkerFailure failure(int rank, int local_rank) {
  WorkerFailure f;
  f.rank = rank;
  f.local_rank = local_rank;
  f.host = "node7";
  f.signal = 6;
  return f;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("healthy GPUs start without a word", "[gpu_watch]") {
  Watched w;
  GpuWatch watch = w.watch(std::nullopt);
  CHECK(watch.beforeStart().empty());
  CHECK(w.events.empty());
}

TEST_CASE("a sick GPU handed out is named before the start, with a gpu_fault event", "[gpu_watch]") {
  Watched w;
  ScopedEnv retired("FAKE_NVML_RETIRED_PENDING", "2");
  ScopedEnv lost("FAKE_NVML_LOST", "0");
  // Local ranks 0 and 1 get GPUs 2 and 1; the lost GPU 0 is not handed out.
  GpuWatch watch = w.watch("2,1");
  CHECK(watch.beforeStart() ==
        "GPU 2 (GPU-fa4e0000-0000-0000-0000-000000000002, PCI 00000000:30:00.0) of host node7 is sick: memory pages "
        "are pending retirement (an uncorrectable ECC error; the GPU needs a reset)");
  REQUIRE(w.events.size() == 1);
  const std::string& e = w.events[0];
  CHECK(has(e, "gpu_fault {"));
  CHECK(has(e, "\"host\":\"node7\""));
  CHECK(has(e, "\"gpu_index\":2"));
  CHECK(has(e, "\"uuid\":\"GPU-fa4e0000-0000-0000-0000-000000000002\""));
  CHECK(has(e, "\"pci_bus_id\":\"00000000:30:00.0\""));
  CHECK(has(e, "\"kind\":\"retired_pages_pending\""));
  CHECK(has(e, "\"source\":\"nvml\""));
  CHECK(has(e, "\"before_start\":true"));
}

TEST_CASE("a lost GPU handed out makes the node sick", "[gpu_watch]") {
  Watched w;
  ScopedEnv lost("FAKE_NVML_LOST", "1");
  GpuWatch watch = w.watch(std::nullopt);
  CHECK(watch.beforeStart() ==
        "GPU 1 of host node7 is sick: NVML says the GPU is lost (nvmlDeviceGetHandleByIndex_v2)");
  REQUIRE(w.events.size() == 1);
  CHECK(has(w.events[0], "\"kind\":\"gpu_lost\""));
  CHECK(has(w.events[0], "\"gpu_index\":1"));
}

TEST_CASE("a worker whose stderr named a CUDA fault gets its GPU, UUID, bus id and host in the report", "[gpu_watch]") {
  Watched w;
  GpuWatch watch = w.watch("2,1");
  REQUIRE(watch.beforeStart().empty());
  watch.onStderrLine(5, "[rank5]: Traceback (most recent call last):");
  watch.onStderrLine(5, "[rank5]: RuntimeError: CUDA error: an illegal memory access was encountered");
  watch.onStderrLine(5, "[rank5]: RuntimeError: CUDA error: unspecified launch failure");  // the first one counts
  std::vector<WorkerFailure> failures{failure(5, 1), failure(4, 0)};
  watch.explainFailures(failures);
  CHECK(failures[0].gpu_fault ==
        "illegal memory access on GPU 1 (GPU-fa4e0000-0000-0000-0000-000000000001, PCI 00000000:20:00.0) of host "
        "node7: [rank5]: RuntimeError: CUDA error: an illegal memory access was encountered");
  CHECK(failures[1].gpu_fault.empty());
  REQUIRE(w.events.size() == 1);
  const std::string& e = w.events[0];
  CHECK(has(e, "\"rank\":5"));
  CHECK(has(e, "\"local_rank\":1"));
  CHECK(has(e, "\"gpu_index\":1"));
  CHECK(has(e, "\"kind\":\"illegal_memory_access\""));
  CHECK(has(e, "\"source\":\"stderr\""));
  CHECK(has(e, "\"hardware\":false"));

  // A new attempt forgets the old attempt's lines.
  REQUIRE(watch.beforeStart().empty());
  std::vector<WorkerFailure> again{failure(5, 1)};
  watch.explainFailures(again);
  CHECK(again[0].gpu_fault.empty());
}

TEST_CASE("the error file and the saved Python exception say the CUDA fault too", "[gpu_watch]") {
  Watched w;
  GpuWatch watch = w.watch(std::nullopt);
  REQUIRE(watch.beforeStart().empty());
  std::vector<WorkerFailure> failures{failure(0, 0), failure(1, 1)};
  failures[0].error = WorkerErrorRecord{"CUDA error: uncorrectable ECC error encountered", "", std::nullopt};
  failures[1].python_exception =
      "Traceback (most recent call last):\nRuntimeError: CUDA error: device-side assert "
      "triggered\n";
  watch.explainFailures(failures);
  CHECK(has(failures[0].gpu_fault, "uncorrectable ECC error on GPU 0 (GPU-fa4e0000-0000-0000-0000-000000000000"));
  CHECK(has(failures[1].gpu_fault, "device-side assert on GPU 1 ("));
  REQUIRE(w.events.size() == 2);
  CHECK(has(w.events[0], "\"source\":\"error_file\""));
  CHECK(has(w.events[0], "\"hardware\":true"));
  CHECK(has(w.events[1], "\"source\":\"python_exception\""));
}

TEST_CASE("the kernel log's Xid about a failed worker's GPU is in its report line", "[gpu_watch]") {
  Watched w;
  GpuWatch watch = w.watch(std::nullopt, 3);
  // Before the start: not this attempt's.
  std::ofstream(w.kmsg(), std::ios::app) << "4,1,1,-;NVRM: Xid (PCI:0000:20:00): 79, pid=1, old news\n";
  REQUIRE(watch.beforeStart().empty());
  std::ofstream(w.kmsg(), std::ios::app)
      << "4,2,2,-;NVRM: Xid (PCI:0000:20:00): 79, pid=77, name=python, GPU has fallen off the bus.\n"
      << "4,3,3,-;NVRM: Xid (PCI:0000:30:00): 48, An uncorrectable double bit error (DBE) has been detected\n"
      << "4,4,4,-;NVRM: Xid (PCI:0000:90:00): 31, a GPU this node does not hand out\n";
  std::vector<WorkerFailure> failures{failure(1, 1)};
  watch.explainFailures(failures);
  CHECK(failures[0].gpu_fault ==
        "Xid 79 (the GPU fell off the bus) on GPU 1 (GPU-fa4e0000-0000-0000-0000-000000000001, PCI "
        "00000000:20:00.0) of host node7; kernel log: NVRM: Xid (PCI:0000:20:00): 79, pid=77, name=python, GPU has "
        "fallen off the bus.");
  // Rank 1's, then GPU 2's, which no failure accounts for; not the one on bus 0x90.
  REQUIRE(w.events.size() == 2);
  CHECK(has(w.events[0], "\"rank\":1"));
  CHECK(has(w.events[0], "\"kind\":\"xid\""));
  CHECK(has(w.events[0], "\"xid\":79"));
  CHECK(has(w.events[0], "\"source\":\"kernel_log\""));
  CHECK(has(w.events[1], "\"rank\":null"));
  CHECK(has(w.events[1], "\"gpu_index\":2"));
  CHECK(has(w.events[1], "\"xid\":48"));
}

TEST_CASE("without NVML the fault is still reported, naming the CUDA_VISIBLE_DEVICES entry", "[gpu_watch]") {
  Watched w;
  GpuWatch watch = w.watch("3,5", 2, "/nonexistent/libnvidia-ml.so.1");
  CHECK(watch.beforeStart().empty());
  watch.onStderrLine(1, "RuntimeError: CUDA error: an illegal memory access was encountered");
  std::vector<WorkerFailure> failures{failure(1, 1)};
  watch.explainFailures(failures);
  CHECK(has(failures[0].gpu_fault,
            "illegal memory access on its GPU (CUDA_VISIBLE_DEVICES entry '5'; NVML could "
            "not be asked: /nonexistent/libnvidia-ml.so.1"));
  CHECK(has(failures[0].gpu_fault, "of host node7: RuntimeError: CUDA error"));
  REQUIRE(w.events.size() == 1);
  CHECK(has(w.events[0], "\"gpu_index\":null"));
}
