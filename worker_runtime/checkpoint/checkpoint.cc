// The collective save and load (checkpoint.h): rank 0 writes every rank's generator states,
// every rank loads its own.
#include "worker_runtime/checkpoint/checkpoint.h"

#include "common/logging.h"
#include "worker_runtime/checkpoint/group_view_impl.h"

namespace ddprun::checkpoint {
namespace {

using detail::GroupView;
using detail::viewOf;

// Every rank's `state` (equal sizes), gathered over the group on its default device.
std::vector<at::Tensor> gatherStates(const at::Tensor& state, const dist::Group& group, int size) {
  const at::Device device = dist::get_default_device(group);
  at::Tensor mine = state.to(device);
  std::vector<at::Tensor> gathered;
  for (int i = 0; i < size; ++i) gathered.push_back(at::empty_like(mine));
  dist::all_gather(gathered, mine, group);
  for (auto& g : gathered) g = g.cpu();
  return gathered;
}

}  // namespace

void save(const std::string& path, const torch::nn::Module& model, const torch::optim::Optimizer* optimizer,
          const TrainingProgress& progress, const dist::Group& group) {
  const GroupView view = viewOf(group);
  std::vector<at::Tensor> rng_states = {cpuRngState()};
  std::vector<at::Tensor> cuda_rng_states = {cudaRngState()};
  if (view.distributed && view.size > 1) {
    rng_states = gatherStates(rng_states[0], group, view.size);
    // Every rank of a job sees the same number of devices, or none: the gathered sizes match.
    if (cuda_rng_states[0].numel() > 0) cuda_rng_states = gatherStates(cuda_rng_states[0], group, view.size);
  }
  if (view.rank == 0) saveFile(path, model, optimizer, progress, rng_states, cuda_rng_states);
  if (view.distributed) dist::barrier(group);
}

TrainingProgress load(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                      torch::Device map_location, const dist::Group& group) {
  const GroupView view = viewOf(group);
  LoadedCheckpoint loaded = loadFile(path, model, optimizer, map_location);
  if (loaded.cuda_rng_states.size() == static_cast<size_t>(view.size) &&
      !setCudaRngState(loaded.cuda_rng_states[static_cast<size_t>(view.rank)])) {
    logger("checkpoint")->warn("{} holds CUDA generator states for another number of devices: not restored", path);
  }
  if (loaded.rng_states.size() == static_cast<size_t>(view.size)) {
    setCpuRngState(loaded.rng_states[static_cast<size_t>(view.rank)]);
  } else {
    logger("checkpoint")
        ->warn("{} holds generator states for {} ranks, this group has {}: generator not restored", path,
               loaded.rng_states.size(), view.size);
  }
  return loaded.progress;
}

}  // namespace ddprun::checkpoint
