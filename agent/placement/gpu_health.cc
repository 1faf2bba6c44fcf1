#include "agent/placement/gpu_health.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "agent/worker_env.h"

namespace ddprun::agent {

std::vector<RankGpu> localRankGpus(const NvmlSession& session, const std::optional<std::string>& cuda_visible,
                                   int nproc) {
  std::vector<RankGpu> gpus;
  const unsigned count = session.count();
  bool stopped = false;  // CUDA ignores every entry after an invalid one
  for (int local_rank = 0; local_rank < nproc; ++local_rank) {
    RankGpu gpu;
    gpu.local_rank = local_rank;
    // Entry local_rank of the list, as --virtual_local_rank hands it out; the index itself
    // without a list.
    gpu.entry = virtualDevice(cuda_visible, local_rank).value_or("");
    const std::string& entry = gpu.entry;
    if (stopped || entry.empty() || entry.front() == '-') {
      stopped = true;
    } else if (entry.front() >= '0' && entry.front() <= '9') {
      unsigned index = 0;
      const auto [end, ec] = std::from_chars(entry.data(), entry.data() + entry.size(), index);
      if (ec == std::errc() && end == entry.data() + entry.size() && index < count) {
        gpu.index = index;
      } else {
        stopped = true;
      }
    } else if (entry.rfind("GPU-", 0) == 0) {
      gpu.index = session.indexOfUuid(entry);
    }
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

std::vector<unsigned> distinctGpus(const std::vector<RankGpu>& gpus) {
  std::vector<unsigned> indices;
  for (const RankGpu& gpu : gpus) {
    if (gpu.index && std::find(indices.begin(), indices.end(), *gpu.index) == indices.end()) {
      indices.push_back(*gpu.index);
    }
  }
  return indices;
}

std::string sickLine(const GpuHealth& health, const std::string& host) {
  std::vector<std::string> problems;
  for (const GpuProblem& p : health.problems) problems.push_back(p.text);
  return fmt::format("{} of host {} is sick: {}", describeGpu(health.gpu), host, fmt::join(problems, "; "));
}

}  // namespace ddprun::agent
