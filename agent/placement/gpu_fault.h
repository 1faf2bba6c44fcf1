// What says that a worker died of a GPU fault: the CUDA error texts that torch, NCCL and
// the CUDA runtime print (cudaGetErrorString's words), and the NVIDIA driver's lines in the
// kernel log (NVRM: Xid ..., "GPU has fallen off the bus"), read from /dev/kmsg where this
// process may. Pure functions over text, and one small reader of the kernel log.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/unique_fd.h"

namespace ddprun::agent {

struct CudaFault {
  // illegal_memory_access, uncorrectable_ecc, fell_off_bus, launch_failure, device_assert.
  std::string kind;
  std::string what;  // "illegal memory access", for a sentence
  // Whether the GPU itself is the likely cause (an ECC error, a GPU off the bus), rather than
  // the program (a device-side assert, an illegal address are most often bugs).
  bool hardware = false;
  std::string line;  // the line that says it, trimmed, at most 300 bytes
};

// The last line of `text` (one line or several: a traceback's source lines come before its
// exception's) that names a CUDA error the GPU or its kernels hit:
//   "an illegal memory access was encountered" (cudaErrorIllegalAddress, 700),
//   "uncorrectable ECC error encountered" (cudaErrorECCUncorrectable, 214),
//   "GPU has fallen off the bus" (the driver's words, which CUDA and NVML pass on),
//   "unspecified launch failure" (cudaErrorLaunchFailure, 719),
//   "device-side assert triggered" (cudaErrorAssert, 710; torch's out-of-bounds index).
// Nothing when no line does. Never throws.
std::optional<CudaFault> cudaFaultIn(std::string_view text);

// A line of the NVIDIA driver in the kernel log about one GPU.
struct KernelGpuEvent {
  unsigned domain = 0, bus = 0, device = 0;  // its PCI address
  int xid = -1;                              // the Xid number; -1: not an Xid line
  std::string kind;                          // "xid" or "fell_off_bus"
  std::string line;                          // the message, trimmed, at most 300 bytes
};

// Reads one kernel log message (the text after /dev/kmsg's "prio,seq,time,flags;" header,
// or a dmesg line): "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus."
// or "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.". Nothing for any other line.
std::optional<KernelGpuEvent> nvrmEventIn(std::string_view message);

// What an Xid number usually means, for the report ("the GPU fell off the bus"); empty for
// numbers without a well-known meaning.
std::string xidMeaning(int xid);

// The kernel log from the moment it was opened: /dev/kmsg, read without blocking. Where this
// process may not read it (kernel.dmesg_restrict, a container without CAP_SYSLOG) it reads
// nothing.
class KernelLog {
 public:
  // Opens `path` non-blocking and moves to its end. Never throws; see readable().
  explicit KernelLog(const std::string& path = "/dev/kmsg");
  bool readable() const { return static_cast<bool>(fd_); }
  // Why not readable ("/dev/kmsg: Operation not permitted"); empty when readable.
  const std::string& problem() const { return problem_; }
  // The messages logged since the open or the last call (headers and continuation lines
  // dropped), oldest first; at most `max_bytes` of the log are read. Never blocks or throws.
  std::vector<std::string> readNew(size_t max_bytes = size_t{1} << 20);

 private:
  UniqueFd fd_;
  std::string problem_;
  std::string partial_;  // a line cut by max_bytes, finished by the next call
};

}  // namespace ddprun::agent
