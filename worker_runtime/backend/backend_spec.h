// Which backend runs the tensors of each device type in a process group, from the string
// init_process_group takes, as torch reads it: "gloo" (or "cpu"), "nccl", "auto", or the
// per-device form "cpu:gloo,cuda:nccl". No LibTorch here, so it is unit-tested alone.
#pragma once

#include <string>
#include <string_view>

namespace ddprun::runtime {

// What runs one device type's tensors.
enum class DeviceBackend : unsigned char {
  kNone,          // nothing: an op on such a tensor is an error naming the group's backend
  kHost,          // the host backend (TCP / shared memory); CUDA tensors through pinned host copies
  kNccl,          // NCCL (CUDA tensors only)
  kNcclIfViable,  // NCCL where it is viable here, else the host backend ("auto")
};

struct BackendSpec {
  DeviceBackend cpu = DeviceBackend::kHost;
  DeviceBackend cuda = DeviceBackend::kNcclIfViable;
};

// Parses a backend string (case-insensitive, as torch's Backend() is). Throws UsageError with
// one line naming the culprit: an unknown backend or device, NCCL for CPU tensors, a device
// named twice, an empty entry.
BackendSpec parseBackendSpec(std::string_view text);

// kNcclIfViable settled: NCCL when `nccl_viable`, else the host backend.
BackendSpec resolveBackendSpec(BackendSpec spec, bool nccl_viable);

// The resolved spec the way torch's get_backend() names it: "gloo" when the host backend runs
// everything, "nccl" for NCCL alone, else the per-device form ("cpu:gloo,cuda:nccl").
std::string describeBackendSpec(const BackendSpec& spec);

}  // namespace ddprun::runtime
