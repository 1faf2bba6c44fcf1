#include "agent/placement/gpu_fault.h"

#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::agent;
using ddprun::testing::TempDir;

// In the words torch (1.13 to 2.11), NCCL and the CUDA runtime print them: cudaGetErrorString's
// texts inside torch's RuntimeError, ProcessGroupNCCL's watchdog and NCCL's own warnings.
TEST_CASE("a CUDA fault is found in the lines torch and NCCL print", "[gpu_fault]") {
  const std::string traceback =
      "[rank1]: Traceback (most recent call last):\n"
      "[rank1]:   File \"/job/train.py\", line 12, in <module>\n"
      "[rank1]:     y = x[idx].sum().item()\n"
      "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
      "[rank1]: CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
      "below might be incorrect.\n"
      "[rank1]: For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n";
  auto fault = cudaFaultIn(traceback);
  REQUIRE(fault);
  CHECK(fault->kind == "illegal_memory_access");
  CHECK(fault->what == "illegal memory access");
  CHECK_FALSE(fault->hardware);
  CHECK(fault->line == "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered");

  fault = cudaFaultIn(
      "[rank0]:[E1127 05:00:00.123456789 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank 0] Process "
      "group watchdog thread terminated with exception: CUDA error: uncorrectable ECC error encountered");
  REQUIRE(fault);
  CHECK(fault->kind == "uncorrectable_ecc");
  CHECK(fault->hardware);

  fault = cudaFaultIn(
      "node7:1234:1250 [1] NCCL INFO misc/strongstream.cc:395 NCCL WARN Cuda failure 'GPU has fallen "
      "off the bus'");
  REQUIRE(fault);
  CHECK(fault->kind == "fell_off_bus");
  CHECK(fault->hardware);

  fault = cudaFaultIn("RuntimeError: CUDA error: device-side assert triggered\n");
  REQUIRE(fault);
  CHECK(fault->kind == "device_assert");
  fault = cudaFaultIn("RuntimeError: CUDA error: unspecified launch failure");
  REQUIRE(fault);
  CHECK(fault->kind == "launch_failure");

  // A hardware fault named on the same line as an illegal access is the hardware's.
  fault = cudaFaultIn("NCCL WARN uncorrectable ECC error encountered; an illegal memory access was encountered");
  REQUIRE(fault);
  CHECK(fault->kind == "uncorrectable_ecc");
}

TEST_CASE("lines that name no GPU fault are not one", "[gpu_fault]") {
  CHECK_FALSE(cudaFaultIn(""));
  CHECK_FALSE(cudaFaultIn("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"));
  CHECK_FALSE(
      cudaFaultIn("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:219, unhandled "
                  "system error"));
  CHECK_FALSE(cudaFaultIn("illegal memory access"));  // not CUDA's sentence
}

TEST_CASE("the NVIDIA driver's kernel log lines name the GPU by its PCI address", "[gpu_fault]") {
  auto xid = nvrmEventIn("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.");
  REQUIRE(xid);
  CHECK(xid->kind == "xid");
  CHECK(xid->xid == 79);
  CHECK(xid->domain == 0);
  CHECK(xid->bus == 0x3b);
  CHECK(xid->device == 0);
  CHECK(xid->line == "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.");

  // Older drivers leave out "PCI:"; the domain may be non-zero.
  xid = nvrmEventIn("NVRM: Xid (0001:af:1f): 48, An uncorrectable double bit error (DBE) has been detected");
  REQUIRE(xid);
  CHECK(xid->xid == 48);
  CHECK(xid->domain == 1);
  CHECK(xid->bus == 0xaf);
  CHECK(xid->device == 0x1f);

  auto off = nvrmEventIn("NVRM: GPU 0000:86:00.0: GPU has fallen off the bus.");
  REQUIRE(off);
  CHECK(off->kind == "fell_off_bus");
  CHECK(off->xid == -1);
  CHECK(off->bus == 0x86);

  CHECK_FALSE(nvrmEventIn("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15"));
  CHECK_FALSE(nvrmEventIn("NVRM: Xid (PCI:zz:3b:00): 79, bad address"));
  CHECK_FALSE(nvrmEventIn("NVRM: Xid (PCI:0000:3b:00): , no number"));
  CHECK_FALSE(nvrmEventIn("usb 1-1: new high-speed USB device"));
  CHECK(xidMeaning(79) == "the GPU fell off the bus");
  CHECK(xidMeaning(12345).empty());
}

TEST_CASE("the kernel log reader returns only what was logged after it opened, without headers", "[gpu_fault]") {
  TempDir dir;
  const std::string path = dir.file("kmsg");
  std::ofstream(path) << "6,100,1000,-;NVRM: Xid (PCI:0000:10:00): 79, an old one, before the start\n";
  KernelLog log(path);
  REQUIRE(log.readable());
  CHECK(log.problem().empty());
  CHECK(log.readNew().empty());
  {
    std::ofstream out(path, std::ios::app);
    out << "4,101,2000,-;NVRM: Xid (PCI:0000:20:00): 48, An uncorrectable double bit error\n"
        << " SUBSYSTEM=pci\n"
        << " DEVICE=+pci:0000:20:00.0\n"
        << "6,102,2001,c;a line; with a semicolon\n"
        << "plain dmesg line\n"
        << "6,103,2002,-;cut short";
  }
  auto messages = log.readNew();
  REQUIRE(messages.size() == 3);
  CHECK(messages[0] == "NVRM: Xid (PCI:0000:20:00): 48, An uncorrectable double bit error");
  CHECK(messages[1] == "a line; with a semicolon");
  CHECK(messages[2] == "plain dmesg line");
  // The record cut short is finished by the next read.
  std::ofstream(path, std::ios::app) << " at last\n";
  messages = log.readNew();
  REQUIRE(messages.size() == 1);
  CHECK(messages[0] == "cut short at last");
  CHECK(log.readNew().empty());
}

TEST_CASE("a kernel log that cannot be read reads nothing and says why", "[gpu_fault]") {
  KernelLog log("/nonexistent/kmsg");
  CHECK_FALSE(log.readable());
  CHECK(log.problem() == "/nonexistent/kmsg: No such file or directory");
  CHECK(log.readNew().empty());
}

TEST_CASE("of several lines naming a CUDA fault the last one counts: a traceback's exception line", "[gpu_fault]") {
  auto fault = cudaFaultIn(
      "Traceback (most recent call last):\n"
      "  File \"/job/t.py\", line 1, in <module>\n"
      "    raise RuntimeError('CUDA error: an illegal memory access was encountered')\n"
      "RuntimeError: CUDA error: an illegal memory access was encountered\n"
      "CUDA kernel errors might be asynchronously reported at some other API call\n");
  REQUIRE(fault);
  CHECK(fault->line == "RuntimeError: CUDA error: an illegal memory access was encountered");
}
