#include "agent/placement/gpu_watch.h"

#include <fmt/format.h>

#include <cstdlib>

#include "common/env_names.h"
#include "common/logging.h"
#include "common/text_escape.h"

namespace ddprun::agent {
namespace {

// Xids that most often come from the program rather than the GPU (NVIDIA's Xid catalog).
bool xidFromProgram(int xid) { return xid == 13 || xid == 31 || xid == 43 || xid == 45; }

std::string xidText(const KernelGpuEvent& e) {
  if (e.kind != "xid") return "GPU fell off the bus";
  const std::string meaning = xidMeaning(e.xid);
  return meaning.empty() ? fmt::format("Xid {}", e.xid) : fmt::format("Xid {} ({})", e.xid, meaning);
}

bool samePci(const KernelGpuEvent& e, const GpuIdentity& gpu) {
  return !gpu.bus_id.empty() && e.domain == gpu.domain && e.bus == gpu.bus && e.device == gpu.device;
}

}  // namespace

std::string kernelLogPath() {
  const char* path = std::getenv(env::kKernelLog);
  return path && *path ? path : "/dev/kmsg";
}

GpuWatch::Options GpuWatch::optionsFor(std::string host, int nproc_per_node,
                                       const std::map<std::string, std::string>& environment) {
  Options options;
  options.host = std::move(host);
  options.nproc_per_node = nproc_per_node;
  if (auto visible = environment.find(env::kCudaVisibleDevices); visible != environment.end()) {
    options.cuda_visible_devices = visible->second;
  }
  return options;
}

GpuWatch::GpuWatch(Options options, Emit emit) : options_(std::move(options)), emit_(std::move(emit)) {}
GpuWatch::~GpuWatch() = default;

std::string GpuWatch::beforeStart() {
  auto log = logger("agent");
  stderr_faults_.clear();
  kernel_log_ = std::make_unique<KernelLog>(options_.kernel_log);
  if (!kernel_log_->readable() && !kernel_log_said_) {
    kernel_log_said_ = true;
    log->debug("no kernel log for GPU faults ({}); Xid lines are not read", kernel_log_->problem());
  }

  NvmlSession nvml(options_.nvml_library);
  rank_gpus_ = localRankGpus(nvml, options_.cuda_visible_devices, options_.nproc_per_node);
  identities_.clear();
  nvml_problem_ = nvml.problem();
  if (!nvml.ready()) {
    if (!nvml_said_) {
      nvml_said_ = true;
      // No NVML is a host without NVIDIA GPUs, and no news; an NVML that answers nonsense is
      // a broken driver, which the user is told of.
      if (nvml.refused()) {
        log->warn("GPU health not checked: {}", nvml_problem_);
      } else {
        log->debug("GPU health not checked: no NVML ({})", printable(nvml_problem_));
      }
    }
    return {};
  }
  std::vector<std::string> sick;
  for (unsigned index : distinctGpus(rank_gpus_)) {
    GpuHealth health = nvml.health(index);
    identities_[index] = health.gpu;
    if (!health.unchecked.empty()) {
      log->debug("{}: not checked: {}", describeGpu(health.gpu), fmt::join(health.unchecked, ", "));
    }
    if (!health.sick()) continue;
    const std::string line = sickLine(health, options_.host);
    log->error("{}", line);
    std::vector<std::string> problems;
    for (const GpuProblem& p : health.problems) problems.push_back(p.text);
    JsonObject fields = gpuFields(&health.gpu);
    fields.add("kind", health.problems.front().kind)
        .add("hardware", true)
        .add("source", "nvml")
        .add("message", fmt::format("{}", fmt::join(problems, "; ")))
        .add("before_start", true);
    emit_("gpu_fault", fields);
    sick.push_back(line);
  }
  return fmt::format("{}", fmt::join(sick, "; "));
}

void GpuWatch::onStderrLine(int rank, std::string_view line) {
  if (stderr_faults_.count(rank)) return;
  if (auto fault = cudaFaultIn(line)) stderr_faults_.emplace(rank, std::move(*fault));
}

std::string GpuWatch::gpuName(int local_rank, const GpuIdentity** identity) const {
  *identity = nullptr;
  for (const RankGpu& gpu : rank_gpus_) {
    if (gpu.local_rank != local_rank) continue;
    if (gpu.index) {
      auto it = identities_.find(*gpu.index);
      if (it != identities_.end()) {
        *identity = &it->second;
        return describeGpu(it->second);
      }
    }
    if (!nvml_problem_.empty()) {
      return fmt::format("its GPU (CUDA_VISIBLE_DEVICES entry '{}'; NVML could not be asked: {})", printable(gpu.entry),
                         printable(nvml_problem_));
    }
    return fmt::format("its GPU (CUDA_VISIBLE_DEVICES entry '{}', which NVML does not know)", printable(gpu.entry));
  }
  return "its GPU";
}

JsonObject GpuWatch::gpuFields(const GpuIdentity* identity) const {
  JsonObject fields;
  fields.add("host", options_.host);
  if (identity) {
    fields.add("gpu_index", identity->index).add("uuid", identity->uuid).add("pci_bus_id", identity->bus_id);
  } else {
    fields.addNull("gpu_index").addNull("uuid").addNull("pci_bus_id");
  }
  return fields;
}

void GpuWatch::explainFailures(std::vector<WorkerFailure>& failures) {
  auto log = logger("agent");
  std::vector<KernelGpuEvent> kernel;
  if (kernel_log_) {
    for (const std::string& message : kernel_log_->readNew()) {
      if (auto event = nvrmEventIn(message)) kernel.push_back(std::move(*event));
    }
  }
  std::vector<bool> kernel_used(kernel.size(), false);

  for (WorkerFailure& f : failures) {
    if (!f.elsewhere.empty()) continue;  // a rank of another node: its GPUs are not this node's
    std::optional<CudaFault> fault;
    std::string source;
    if (auto it = stderr_faults_.find(f.rank); it != stderr_faults_.end()) {
      fault = it->second;
      source = "stderr";
    } else if (f.error && (fault = cudaFaultIn(f.error->message))) {
      source = "error_file";
    } else if ((fault = cudaFaultIn(f.python_exception))) {
      source = "python_exception";
    } else if ((fault = cudaFaultIn(f.stderr_tail))) {
      source = "stderr";
    }
    const GpuIdentity* identity = nullptr;
    const std::string gpu = gpuName(f.local_rank, &identity);
    std::vector<const KernelGpuEvent*> about;
    for (size_t i = 0; i < kernel.size(); ++i) {
      if (identity && samePci(kernel[i], *identity)) {
        about.push_back(&kernel[i]);
        kernel_used[i] = true;
      }
    }
    if (!fault && about.empty()) continue;

    std::string text;
    JsonObject fields = gpuFields(identity);
    fields.add("rank", f.rank).add("local_rank", f.local_rank);
    if (fault) {
      text = fmt::format("{} on {} of host {}: {}", fault->what, gpu, options_.host, printable(fault->line));
      fields.add("kind", fault->kind).add("hardware", fault->hardware || !about.empty());
      fields.add("source", source).add("message", fault->line);
    } else {
      const KernelGpuEvent& first = *about.front();
      text = fmt::format("{} on {} of host {}", xidText(first), gpu, options_.host);
      fields.add("kind", first.kind).add("hardware", first.kind != "xid" || !xidFromProgram(first.xid));
      fields.add("source", "kernel_log").add("message", first.line);
    }
    for (const KernelGpuEvent* e : about) text += fmt::format("; kernel log: {}", printable(e->line));
    if (!about.empty() && about.front()->xid >= 0) fields.add("xid", about.front()->xid);
    f.gpu_fault = text;
    const bool program = fault && !fault->hardware && about.empty();
    log->error("rank {} (local rank {}) died of a {}: {}", f.rank, f.local_rank, program ? "CUDA error" : "GPU fault",
               text);
    emit_("gpu_fault", fields);
  }

  // The driver's word about a GPU this node hands out that no failure above accounts for.
  for (size_t i = 0; i < kernel.size(); ++i) {
    if (kernel_used[i]) continue;
    const KernelGpuEvent& e = kernel[i];
    const GpuIdentity* identity = nullptr;
    for (const auto& [index, gpu] : identities_) {
      if (samePci(e, gpu)) identity = &gpu;
    }
    if (!identity) {
      log->debug("kernel log, about a GPU this node does not hand out: {}", printable(e.line));
      continue;
    }
    log->error("{} on {} of host {}: kernel log: {}", xidText(e), describeGpu(*identity), options_.host,
               printable(e.line));
    JsonObject fields = gpuFields(identity);
    fields.addNull("rank").add("kind", e.kind).add("hardware", e.kind != "xid" || !xidFromProgram(e.xid));
    fields.add("source", "kernel_log").add("message", e.line);
    if (e.xid >= 0) fields.add("xid", e.xid);
    emit_("gpu_fault", fields);
  }
}

}  // namespace ddprun::agent
