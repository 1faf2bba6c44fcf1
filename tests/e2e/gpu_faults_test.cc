// GPU faults and GPU health through the real ddprun, against the fake NVML the tests build
// (tests/support/fake_nvml.cc: GPU k is GPU-fa4e0000-0000-0000-0000-00000000000k on PCI bus
// 0x10 * (k + 1)), which DDPRUN_NVML_LIBRARY points the agent at; DDPRUN_KERNEL_LOG stands in
// for /dev/kmsg. The workers are shell scripts that print what torch prints and die as it does.
#include <unistd.h>

#include <fstream>

#include <catch2/catch.hpp>

#include "tests/e2e/ops_support.h"

using namespace ddprun::testing;
using namespace ddprun::testing::ops;

namespace {

std::string hostName() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

// The fake NVML with three healthy GPUs, an empty kernel log and an events file in `dir`.
std::map<std::string, std::string> fakeGpus(const TempDir& dir) {
  if (!fileExists(dir.file("kmsg"))) run({"/usr/bin/touch", dir.file("kmsg")}, {}, 10s);
  return {{"DDPRUN_NVML_LIBRARY", DDPRUN_FAKE_NVML},
          {"FAKE_NVML_COUNT", "3"},
          {"FAKE_NVML_LOST", ""},
          {"FAKE_NVML_RETIRED_PENDING", ""},
          {"DDPRUN_KERNEL_LOG", dir.file("kmsg")},
          {"DDPRUN_EVENTS_FILE", dir.file("events.jsonl")},
          {"CUDA_VISIBLE_DEVICES", ""}};
}

}  // namespace

TEST_CASE("a worker killed by SIGABRT after a CUDA illegal memory access gets its GPU named in the report",
          "[e2e][gpu]") {
  TempDir dir;
  auto env = fakeGpus(dir);
  env["CUDA_VISIBLE_DEVICES"] = "2,1";  // local rank 1 uses GPU 1
  env["TMPDIR"] = dir.path();           // --tee without --log_dir keeps the logs under TMPDIR
  // As torch's NCCL watchdog dies: the error on stderr, then abort().
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--tee=2", "--no_python", "sh", "-c",
                "if [ $LOCAL_RANK = 1 ]; then "
                "echo 'RuntimeError: CUDA error: an illegal memory access was encountered' >&2; "
                "echo 'For debugging consider passing CUDA_LAUNCH_BLOCKING=1' >&2; kill -ABRT $$; fi; exec sleep 30"},
               env, 60s);
  REQUIRE(r.finished);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  const std::string gpu =
      "GPU 1 (GPU-fa4e0000-0000-0000-0000-000000000001, PCI 00000000:20:00.0) of host " + hostName();
  CHECK_THAT(r.err, Catch::Contains("killed by SIGABRT"));
  CHECK_THAT(r.err, Catch::Contains("gpu fault : illegal memory access on " + gpu +
                                    ": RuntimeError: CUDA error: an illegal memory access was encountered"));
  CHECK_THAT(r.err, Catch::Contains("rank 1 (local rank 1) died of a CUDA error: illegal memory access on " + gpu));

  auto checked = checkWithPython(dir.file("events.jsonl"), R"(
import json, sys
faults = [e for e in map(json.loads, open(sys.argv[1])) if e["event"] == "gpu_fault"]
assert len(faults) == 1, faults
f = faults[0]
assert (f["rank"], f["local_rank"], f["gpu_index"]) == (1, 1, 1), f
assert f["uuid"] == "GPU-fa4e0000-0000-0000-0000-000000000001", f
assert f["pci_bus_id"] == "00000000:20:00.0", f
assert f["kind"] == "illegal_memory_access" and f["source"] == "stderr", f
assert f["host"] and "CUDA error" in f["message"], f
)");
  INFO(readFile(dir.file("events.jsonl")) << checked.err);
  CHECK(checked.exit_code == 0);
}

TEST_CASE("the driver's Xid in the kernel log names the GPU of a worker that said nothing", "[e2e][gpu]") {
  TempDir dir;
  auto env = fakeGpus(dir);
  env["CUDA_VISIBLE_DEVICES"] = "0";
  // The kernel logs the Xid of GPU 0 (bus 0x10) while the worker dies with exit code 1.
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_python", "sh", "-c",
                "printf '4,9,9,-;NVRM: Xid (PCI:0000:10:00): 79, pid=%s, name=python, GPU has fallen off the "
                "bus.\\n' $$ >> \"$DDPRUN_KERNEL_LOG\"; exit 1"},
               env, 60s);
  REQUIRE(r.finished);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("gpu fault : Xid 79 (the GPU fell off the bus) on GPU 0 "
                                    "(GPU-fa4e0000-0000-0000-0000-000000000000, PCI 00000000:10:00.0) of host " +
                                    hostName() + "; kernel log: NVRM: Xid (PCI:0000:10:00): 79, pid="));
  CHECK_THAT(readFile(dir.file("events.jsonl")), Catch::Contains("\"event\":\"gpu_fault\""));
  CHECK_THAT(readFile(dir.file("events.jsonl")), Catch::Contains("\"xid\":79"));
}

TEST_CASE("a job that is not elastic does not start on a GPU with pending retired pages", "[e2e][gpu]") {
  TempDir dir;
  auto env = fakeGpus(dir);
  env["CUDA_VISIBLE_DEVICES"] = "1,0";
  env["FAKE_NVML_RETIRED_PENDING"] = "0";
  env["MARKER"] = dir.file("started");
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--no_python", "sh", "-c", "touch \"$MARKER\""},
               env, 60s);
  REQUIRE(r.finished);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("cannot start workers: GPU 0 (GPU-fa4e0000-0000-0000-0000-000000000000, PCI "
                                    "00000000:10:00.0) of host " +
                                    hostName() + " is sick: memory pages are pending retirement"));
  CHECK_FALSE(fileExists(dir.file("started")));
  auto checked = checkWithPython(dir.file("events.jsonl"), R"(
import json, sys
faults = [e for e in map(json.loads, open(sys.argv[1])) if e["event"] == "gpu_fault"]
assert [(f["gpu_index"], f["kind"], f["before_start"]) for f in faults] == [(0, "retired_pages_pending", True)], faults
)");
  INFO(readFile(dir.file("events.jsonl")) << checked.err);
  CHECK(checked.exit_code == 0);

  SECTION("the same GPUs start when none is sick") {
    env["FAKE_NVML_RETIRED_PENDING"] = "";
    auto ok = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--no_python", "sh", "-c", "touch \"$MARKER\""},
                  env, 60s);
    REQUIRE(ok.finished);
    INFO(ok.err);
    CHECK(ok.exit_code == 0);
    CHECK(fileExists(dir.file("started")));
  }
}

TEST_CASE("in an elastic job a node whose GPU is lost sits out and the job finishes without it", "[e2e][gpu]") {
  int port = 0;  // agent 0, the store's host, takes one from the kernel and announces it
  TempDir dir;
  const std::string conf = "keep_alive_interval=0.5,keep_alive_max_attempt=3,last_call_timeout=0.5";
  const char* script = "echo W ran on $GROUP_WORLD_SIZE node; sleep 2";
  auto healthy_env = fakeGpus(dir);
  TestProcess healthy(withShell(agentArgs("1:2", 1, port, "gpujob", conf + ",is_host=true"), script), healthy_env);
  port = announcedPort(healthy);
  auto sick_env = healthy_env;
  sick_env["FAKE_NVML_LOST"] = "0";
  auto sick_args = agentArgs("1:2", 1, port, "gpujob", conf + ",is_host=false");
  sick_args.push_back("--node_cooldown=1");
  TestProcess sick(withShell(sick_args, script), sick_env);

  REQUIRE(healthy.wait(60s));
  REQUIRE(sick.wait(60s));
  INFO(healthy.err());
  INFO(sick.err());
  CHECK(healthy.exitCode() == 0);
  CHECK(sick.exitCode() == 0);
  CHECK_THAT(sick.err(), Catch::Contains("GPU 0 of host " + hostName() +
                                         " is sick: NVML says the GPU is lost (nvmlDeviceGetHandleByIndex_v2); it "
                                         "sits out of the job for 1.0 s"));
  CHECK_THAT(sick.err(), Catch::Contains("the job finished successfully while this node sat out"));
  CHECK(countOf(healthy.out(), "W ran on 1 node") == 1);
  CHECK(countOf(sick.out(), "W ran") == 0);

  auto checked = checkWithPython(dir.file("events.jsonl"), R"(
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
faults = [e for e in lines if e["event"] == "gpu_fault"]
assert faults and all(f["kind"] == "gpu_lost" and f["gpu_index"] == 0 for f in faults), faults
cool = [e for e in lines if e["event"] == "node_cooldown"]
assert cool and all("GPU 0" in e["reason"] for e in cool), cool
assert {e["node"] for e in faults} == {e["node"] for e in cool}, (faults, cool)
)");
  INFO(readFile(dir.file("events.jsonl")) << checked.err);
  CHECK(checked.exit_code == 0);
}

TEST_CASE("a Python worker's uncaught CUDA error, saved by ddprun's hook, names its GPU", "[e2e][gpu]") {
  TempDir dir;
  auto env = fakeGpus(dir);
  env["CUDA_VISIBLE_DEVICES"] = "GPU-fa4e0000-0000-0000-0000-000000000002";
  const std::string script = dir.file("train.py");
  std::ofstream(script) << "raise RuntimeError('CUDA error: uncorrectable ECC error encountered')\n";
  // No --tee: the worker's stderr goes straight to the console, past the agent.
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", script}, env, 60s);
  REQUIRE(r.finished);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("gpu fault : uncorrectable ECC error on GPU 2 "
                                    "(GPU-fa4e0000-0000-0000-0000-000000000002, PCI 00000000:30:00.0) of host " +
                                    hostName() + ": RuntimeError: CUDA error: uncorrectable ECC error encountered"));
  CHECK_THAT(readFile(dir.file("events.jsonl")), Catch::Contains("\"source\":\"python_exception\""));
}

// A broken driver's nvmlDeviceGetCount_v2: 2^32-1 once resolved gpu to -1 workers (ddprun waited
// forever, silent) and 2^31-1 resolved auto to 2,147,483,647 workers.
TEST_CASE("nproc_per_node gpu or auto with an NVML claiming billions of GPUs exits 2 with one line",
          "[e2e][gpu][bad-input]") {
  TempDir dir;
  auto env = fakeGpus(dir);
  env["MARKER"] = dir.file("started");
  for (const std::string count : {"4294967295", "2147483647"}) {
    for (const std::string value : {"gpu", "auto"}) {
      env["FAKE_NVML_COUNT"] = count;
      auto r = run(
          {ddprunPath(), "--standalone", "--nproc_per_node=" + value, "--no_python", "sh", "-c", "touch \"$MARKER\""},
          env, 30s);
      REQUIRE(r.finished);
      INFO(r.err);
      CHECK(r.exit_code == 2);
      CHECK(r.err == "ddprun: error: --nproc_per_node=" + value + ": NVML (" + DDPRUN_FAKE_NVML + ") reports " + count +
                         " GPUs (more than 1024): refusing\n");
      CHECK_FALSE(fileExists(dir.file("started")));
    }
  }
}

// With a UUID in CUDA_VISIBLE_DEVICES the agent once looked it up through every index NVML
// claimed (0xfffffff0: no worker started within 30 s). The health check is skipped, with a
// warning naming NVML, and the job runs as it would without NVML.
TEST_CASE("CUDA_VISIBLE_DEVICES=GPU-1234 with an NVML claiming 0xfffffff0 GPUs starts its worker at once",
          "[e2e][gpu][bad-input]") {
  TempDir dir;
  auto env = fakeGpus(dir);
  env["FAKE_NVML_COUNT"] = "4294967280";
  env["CUDA_VISIBLE_DEVICES"] = "GPU-1234";
  env["MARKER"] = dir.file("started");
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_python", "sh", "-c", "touch \"$MARKER\""},
               env, 30s);
  REQUIRE(r.finished);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(fileExists(dir.file("started")));
  CHECK(countOf(r.err, "GPU health not checked: NVML (" + std::string(DDPRUN_FAKE_NVML) +
                           ") reports 4294967280 GPUs (more than 1024): refusing") == 1);
}

TEST_CASE("a GPU whose NVML UUID holds escape sequences is named escaped in the sick line", "[e2e][gpu][bad-input]") {
  TempDir dir;
  auto env = fakeGpus(dir);
  env["FAKE_NVML_UUID0"] = "GPU-\x1b]0;PWN\x07\x1b[2J";
  env["FAKE_NVML_RETIRED_PENDING"] = "0";
  env["CUDA_VISIBLE_DEVICES"] = "0";
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_python", "true"}, env, 60s);
  REQUIRE(r.finished);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("GPU 0 (GPU-\\x1b]0;PWN\\x07\\x1b[2J, PCI 00000000:10:00.0) of host " + hostName() +
                                    " is sick: memory pages are pending retirement"));
  CHECK(r.err.find('\x1b') == std::string::npos);
  CHECK(r.err.find('\x07') == std::string::npos);
}
