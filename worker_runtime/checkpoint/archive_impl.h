// The archive inside a checkpoint (checkpoint.h) as bytes, without the file: what saveFile
// writes and loadFile reads, and what in-job recovery hands a replacement (recovery/in_job.h).
// The checkpoint library's insides, shared by its own files.
#pragma once

#include <string>
#include <vector>

#include "worker_runtime/checkpoint/checkpoint.h"

namespace ddprun::checkpoint::detail {

// LibTorch's archive of `model`, `optimizer` (when not null), `progress` and the generator
// states, as saveFile() writes it after its header.
std::string archiveBytes(const torch::nn::Module& model, const torch::optim::Optimizer* optimizer,
                         const TrainingProgress& progress, const std::vector<at::Tensor>& rng_states,
                         const std::vector<at::Tensor>& cuda_rng_states);

// loadFile() on bytes archiveBytes() made; `op` names the source in errors.
LoadedCheckpoint loadArchive(const std::string& payload, const std::string& op, torch::nn::Module& model,
                             torch::optim::Optimizer* optimizer, torch::Device map_location);

}  // namespace ddprun::checkpoint::detail
