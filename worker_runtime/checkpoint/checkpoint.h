// Checkpoints for data-parallel training, as PyTorch's DDP tutorial does them: one rank
// writes, a barrier, every rank loads with its own device mapping. A checkpoint holds the
// model's parameters and buffers, the optimizer's state, where training stands (step,
// epoch, position in the epoch's data order and the seed that order derives from) and the
// default CPU and CUDA generators' states of every rank, so a resumed run continues bit for
// bit. A CUDA model loads with map_location as torch.load's (cuda:N to cuda:M, CUDA to CPU,
// CPU to CUDA); each parameter keeps its own device.
//
// Files are written atomically (a temporary file in the same directory, fsync, rename,
// fsync of the directory): a writer killed at any moment leaves either the previous file
// or the new one, never a torn one. Each file carries a header with a CRC-32 of its
// payload, so a damaged file is a clear error, not garbage in the model.
//
//   namespace ckpt = ddprun::checkpoint;
//   ckpt::CheckpointManager manager({.directory = "ckpt"});
//   if (auto resumed = manager.resumeLatest(*ddp.module(), &optimizer)) progress = *resumed;
//   ...
//   if (progress.step % 100 == 0) manager.save(*ddp.module(), &optimizer, progress);
//
// The file layer (saveFile, loadFile) needs no process group; save, load and
// CheckpointManager are collectives over a group when ddprun::dist is initialized and
// act as a single rank otherwise.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "worker_runtime/distributed.h"

namespace ddprun::checkpoint {

// Where training stands: with model and optimizer, what a trainer needs to continue
// exactly where it stopped.
struct TrainingProgress {
  int64_t step = 0;            // optimizer steps completed
  int64_t epoch = 0;           // epoch the next step belongs to (0-based)
  int64_t batch_in_epoch = 0;  // batches of `epoch` already consumed: the data-order position
  uint64_t data_seed = 0;      // seed each epoch's data order derives from
};

// What loadFile read besides what it copied into the model and optimizer.
struct LoadedCheckpoint {
  TrainingProgress progress;
  // Default CPU generator state of each rank at save time (index = rank); one entry
  // for a single-process save.
  std::vector<at::Tensor> rng_states;
  // Each rank's CUDA generators (cudaRngState()); empty when the saving ranks had no CUDA.
  std::vector<at::Tensor> cuda_rng_states;
};

// The default CPU generator's state (torch.get_rng_state()), and setting it back.
at::Tensor cpuRngState();
void setCpuRngState(const at::Tensor& state);
// The default CUDA generators' states of every visible device, concatenated (torch.cuda.
// get_rng_state_all() as one tensor); empty without CUDA. Setting it back returns false, and
// changes nothing, when this process sees another number of devices.
at::Tensor cudaRngState();
bool setCudaRngState(const at::Tensor& state);

// Writes `model`'s parameters and buffers (registration order, with their names), the
// state of `optimizer` (skipped when null), `progress` and `rng_states` to `path`,
// atomically. Blocks for the write and two fsyncs. Throws DdprunError when the directory
// is missing or a write fails; the previous file at `path` is then untouched, and the
// temporary file removed unless the process itself died. Not a collective. Thread-safe
// for distinct paths.
void saveFile(const std::string& path, const torch::nn::Module& model, const torch::optim::Optimizer* optimizer,
              const TrainingProgress& progress, const std::vector<at::Tensor>& rng_states = {cpuRngState()},
              const std::vector<at::Tensor>& cuda_rng_states = {cudaRngState()});

// Reads `path`, materializing tensors on `map_location` (torch.load's map_location), and
// copies them into `model`'s own parameters and buffers (which keep their devices) and
// into `optimizer` (when not null). Does not touch the generator. Throws DdprunError
// naming the file and the problem when the file is missing, truncated, damaged (CRC
// mismatch), not a ddprun checkpoint, or made for another model (the first parameter
// whose name, shape or dtype differs). On a throw, model and optimizer are unchanged
// unless the mismatch was found in the optimizer's part.
LoadedCheckpoint loadFile(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                          torch::Device map_location = torch::kCPU);

// Checks that `path` is a complete, undamaged checkpoint (header and CRC) without parsing
// it. Returns an empty string when it is, else the reason.
std::string verifyFile(const std::string& path);

// Collective save: gathers every rank's generator state, rank 0 of `group` writes `path`
// (saveFile), and every rank returns only once the file is complete (a barrier), so a
// load right after it sees the new file. Throws on rank 0's write failure; the other ranks
// then fail at the barrier when rank 0 exits.
void save(const std::string& path, const torch::nn::Module& model, const torch::optim::Optimizer* optimizer,
          const TrainingProgress& progress, const dist::Group& group = {});

// Every rank loads `path` (loadFile) and restores its own generator states (CPU, and CUDA
// where the file has them) when the file holds one per rank of a group this size (a warning
// otherwise). Not a collective: call
// it after save's barrier or at start-up.
TrainingProgress load(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                      torch::Device map_location = torch::kCPU, const dist::Group& group = {});

// A directory of numbered checkpoints (checkpoint_<step>.ckpt), the newest `keep` kept.
// Rank 0 writes and every rank reads it, so it must be the same directory for all ranks:
// one host, or a shared file system across nodes.
struct CheckpointManagerOptions {
  std::string directory;  // created by rank 0 if missing. Required.
  int keep = 2;           // checkpoints kept; older ones are removed after each save. >= 1.
  dist::Group group{};    // empty: the default group (or a single process without dist).
  torch::Device map_location = torch::kCPU;
};

class CheckpointManager {
 public:
  // Throws UsageError on an empty directory or keep < 1. Does not touch the disk.
  explicit CheckpointManager(CheckpointManagerOptions options);

  // Collective (see save): rank 0 writes the checkpoint for `progress.step`, removes
  // checkpoints beyond `keep` and temporary files left by writers that died; returns the
  // path written. Throws DdprunError on a write failure.
  std::string save(const torch::nn::Module& model, const torch::optim::Optimizer* optimizer,
                   const TrainingProgress& progress);

  // Collective: rank 0 picks the newest checkpoint that verifies (skipping, with a
  // warning, newer ones that do not) and tells the others; every rank loads it and
  // restores its generator state. Returns nullopt when the directory holds none. Throws
  // DdprunError when a rank cannot load the chosen file.
  //
  // With in-job recovery (docs/recovery.md), a replacement takes model, optimizer,
  // generator states and progress from the lowest surviving rank instead, and reads no file
  // (not a collective then: the survivors are inside their failed step). The progress it
  // gets is the survivor's latest resumed or saved one with `step` and `batch_in_epoch`
  // advanced by the gradient reductions completed since: exact for a trainer that makes one
  // synchronized backward per step and saves at least once per epoch. Every rank registers
  // `model` and `optimizer` as the state it hands a replacement: both must outlive the
  // default process group.
  std::optional<TrainingProgress> resumeLatest(torch::nn::Module& model, torch::optim::Optimizer* optimizer);

  // Local, no collective: the checkpoints in the directory, oldest first (unverified).
  std::vector<std::string> list() const;
  // The path save() uses for `step`.
  std::string pathFor(int64_t step) const;

 private:
  std::optional<TrainingProgress> resumeFromDisk(torch::nn::Module& model, torch::optim::Optimizer* optimizer);
  std::optional<TrainingProgress> resumeFromPeer(torch::nn::Module& model, torch::optim::Optimizer* optimizer);
  // In-job recovery: hands `model` and `optimizer` to a replacement as the state.
  void offerState(torch::nn::Module& model, torch::optim::Optimizer* optimizer, const TrainingProgress& progress);

  CheckpointManagerOptions options_;
  // The progress a replacement resumes from: the latest resumed or saved, and the gradient
  // reductions the runtime had completed then (shared with the registered state source).
  struct Base {
    TrainingProgress progress;
    int64_t reductions = 0;
  };
  std::shared_ptr<Base> base_ = std::make_shared<Base>();
};

}  // namespace ddprun::checkpoint
