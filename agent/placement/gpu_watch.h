// The agent's watch over the GPUs it hands out (agent/gpu_health.h says which):
//  - before each (re)start, their health through NVML: a lost GPU, pending retired pages,
//    pending or failed row remapping. Each sick GPU is logged and written as a gpu_fault
//    event; the agent then sits out (an elastic job) or refuses to start (agent/elastic_agent).
//  - while the workers run, their stderr lines that name a CUDA fault (agent/gpu_fault.h);
//  - when workers fail, the fault each one died of (its stderr, its error file, its Python
//    exception, and the driver's lines in the kernel log about its GPU), named with the GPU's
//    index, UUID and PCI bus id and the host: a line of the failure report
//    (WorkerFailure::gpu_fault), a log line and a gpu_fault event each.
// Without NVML (no driver, a CPU host) the health check is skipped with one debug line and
// faults are still reported, naming the GPU by its CUDA_VISIBLE_DEVICES entry alone.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/ops/failure_report.h"
#include "agent/placement/gpu_fault.h"
#include "agent/placement/gpu_health.h"
#include "common/json_writer.h"

namespace ddprun::agent {

// /dev/kmsg, or $DDPRUN_KERNEL_LOG when set (tests: a file standing in for the kernel log).
std::string kernelLogPath();

class GpuWatch {
 public:
  // Writes one event (the agent's EventLog::emit).
  using Emit = std::function<void(const std::string& event, const JsonObject& fields)>;
  struct Options {
    std::string host;                                 // this host's name, for every line
    int nproc_per_node = 1;                           // local ranks 0..n-1
    std::optional<std::string> cuda_visible_devices;  // the agent's; unset: none
    std::string nvml_library = nvmlLibrary();
    std::string kernel_log = kernelLogPath();
  };
  // The agent's: its host name, its local ranks, and CUDA_VISIBLE_DEVICES from its
  // `environment`; NVML and the kernel log where they are found.
  static Options optionsFor(std::string host, int nproc_per_node,
                            const std::map<std::string, std::string>& environment);
  GpuWatch(Options options, Emit emit);
  ~GpuWatch();

  // Before each (re)start of the workers: checks the health of the GPUs handed out, logs
  // and emits each sick one, and begins a new attempt (the stderr faults seen so far are
  // forgotten; the kernel log is read from now on). Returns the sick GPUs' lines joined by
  // "; " (sickLine()); empty when every GPU handed out is fit, or there is no NVML to ask.
  // Blocks for NVML's calls (milliseconds). Never throws.
  std::string beforeStart();
  // A line of worker `rank`'s stderr: the first one per rank naming a CUDA fault is kept.
  void onStderrLine(int rank, std::string_view line);
  // Sets the gpu_fault of each failure that died of a GPU fault; logs one line and emits a
  // gpu_fault event for each, and for each kernel-log line about a GPU handed out that no
  // failure accounts for. Call once per failed attempt, after the workers' output is drained
  // (so that their last stderr lines were seen). Never throws.
  void explainFailures(std::vector<WorkerFailure>& failures);

 private:
  // What names local rank `local_rank`'s GPU in a sentence, and its identity when known.
  std::string gpuName(int local_rank, const GpuIdentity** identity) const;
  JsonObject gpuFields(const GpuIdentity* identity) const;

  Options options_;
  Emit emit_;
  std::vector<RankGpu> rank_gpus_;              // from the last beforeStart()
  std::map<unsigned, GpuIdentity> identities_;  // by NVML index, from the last beforeStart()
  std::string nvml_problem_;                    // why NVML could not be asked; empty: it was
  std::map<int, CudaFault> stderr_faults_;      // by rank, this attempt
  std::unique_ptr<KernelLog> kernel_log_;       // this attempt's
  bool kernel_log_said_ = false;                // its unreadability was logged (once)
  bool nvml_said_ = false;                      // NVML's absence was logged (once)
};

}  // namespace ddprun::agent
