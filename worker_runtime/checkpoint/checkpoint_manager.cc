// A directory of numbered checkpoints (checkpoint.h): the newest kept, the older ones and the
// temporary files of writers that died removed, and the newest that verifies resumed from.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <regex>

#include "common/error.h"
#include "common/logging.h"
#include "worker_runtime/checkpoint/archive_impl.h"
#include "worker_runtime/checkpoint/checkpoint.h"
#include "worker_runtime/checkpoint/group_view_impl.h"
#include "worker_runtime/recovery/in_job.h"

namespace ddprun::checkpoint {
namespace {

namespace fs = std::filesystem;
using detail::GroupView;
using detail::viewOf;

}  // namespace

CheckpointManager::CheckpointManager(CheckpointManagerOptions options) : options_(std::move(options)) {
  if (options_.directory.empty()) throw UsageError("checkpoint manager: empty directory");
  if (options_.keep < 1)
    throw UsageError("checkpoint manager: keep must be >= 1, got " + std::to_string(options_.keep));
}

std::string CheckpointManager::pathFor(int64_t step) const {
  char name[64];
  std::snprintf(name, sizeof name, "checkpoint_%012lld.ckpt", static_cast<long long>(step));
  return (fs::path(options_.directory) / name).string();
}

std::vector<std::string> CheckpointManager::list() const {
  static const std::regex kName(R"(checkpoint_(\d+)\.ckpt)");
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(options_.directory, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, kName)) found.emplace_back(std::stoll(m[1].str()), entry.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

std::string CheckpointManager::save(const torch::nn::Module& model, const torch::optim::Optimizer* optimizer,
                                    const TrainingProgress& progress) {
  const GroupView view = viewOf(options_.group);
  const std::string path = pathFor(progress.step);
  if (view.rank == 0) {
    std::error_code ec;
    fs::create_directories(options_.directory, ec);
    if (ec) throw DdprunError("checkpoint save(" + path + "): create directory: " + ec.message());
  }
  checkpoint::save(path, model, optimizer, progress, options_.group);
  *base_ = Base{progress, recovery::reductions()};
  if (view.rank != 0) return path;

  // Only rank 0 writes, so only it cleans up: checkpoints beyond `keep`, and temporary
  // files of writers that died mid-save (any pid but ours: one job per directory).
  auto all = list();
  for (size_t i = 0; i + static_cast<size_t>(options_.keep) < all.size(); ++i) {
    std::error_code ec;
    fs::remove(all[i], ec);
  }
  const std::string own_suffix = ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(options_.directory, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".checkpoint_", 0) == 0 && name.find(".ckpt.tmp.") != std::string::npos &&
        name.find(own_suffix) == std::string::npos) {
      std::error_code ignored;
      fs::remove(entry.path(), ignored);
    }
  }
  return path;
}

void CheckpointManager::offerState(torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                                   const TrainingProgress& progress) {
  if (!recovery::active()) return;
  *base_ = Base{progress, recovery::reductions()};
  recovery::setStateSource([base = base_, &model, optimizer] {
    TrainingProgress now = base->progress;
    const int64_t since = recovery::reductions() - base->reductions;
    now.step += since;
    now.batch_in_epoch += since;
    return detail::archiveBytes(model, optimizer, now, {cpuRngState()}, {cudaRngState()});
  });
}

std::optional<TrainingProgress> CheckpointManager::resumeFromPeer(torch::nn::Module& model,
                                                                  torch::optim::Optimizer* optimizer) {
  const std::string state = recovery::receiveState();
  const LoadedCheckpoint loaded =
      detail::loadArchive(state, "in-job recovery: the survivor's state", model, optimizer, options_.map_location);
  if (!loaded.cuda_rng_states.empty() && !setCudaRngState(loaded.cuda_rng_states.front())) {
    logger("checkpoint")->warn("in-job recovery: the survivor has another number of CUDA devices: generator not set");
  }
  setCpuRngState(loaded.rng_states.front());
  offerState(model, optimizer, loaded.progress);
  logger("checkpoint")->info("in-job recovery: took the state of step {} from a surviving rank", loaded.progress.step);
  return loaded.progress;
}

std::optional<TrainingProgress> CheckpointManager::resumeLatest(torch::nn::Module& model,
                                                                torch::optim::Optimizer* optimizer) {
  if (recovery::joining()) return resumeFromPeer(model, optimizer);
  // The start-up a replacement replays ends here: what follows it reads from the disk.
  recovery::endStartup();
  const std::optional<TrainingProgress> resumed = resumeFromDisk(model, optimizer);
  offerState(model, optimizer, resumed.value_or(TrainingProgress{}));
  return resumed;
}

std::optional<TrainingProgress> CheckpointManager::resumeFromDisk(torch::nn::Module& model,
                                                                  torch::optim::Optimizer* optimizer) {
  const GroupView view = viewOf(options_.group);
  int64_t chosen = -1;
  if (view.rank == 0) {
    static const std::regex kName(R"(.*checkpoint_(\d+)\.ckpt)");
    auto all = list();
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      const std::string problem = verifyFile(*it);
      if (problem.empty()) {
        std::smatch m;
        std::regex_match(*it, m, kName);
        chosen = std::stoll(m[1].str());
        break;
      }
      logger("checkpoint")->warn("skipping {}", problem);
    }
  }
  if (view.distributed && view.size > 1) {
    // The group's rank 0 decides, so every rank loads the same step even if a save was
    // racing with the directory scan. Its global rank comes from an all_gather: broadcast
    // takes global ranks.
    const auto on = at::TensorOptions().dtype(at::kLong).device(dist::get_default_device(options_.group));
    std::vector<at::Tensor> globals;
    for (int i = 0; i < view.size; ++i) globals.push_back(at::empty({1}, on));
    dist::all_gather(globals, at::full({1}, static_cast<int64_t>(dist::get_rank()), on), options_.group);
    at::Tensor decided = at::full({1}, chosen, on);
    dist::broadcast(decided, static_cast<int>(globals[0].item<int64_t>()), options_.group);
    chosen = decided.item<int64_t>();
  }
  if (chosen < 0) return std::nullopt;
  const std::string path = pathFor(chosen);
  TrainingProgress progress = load(path, model, optimizer, options_.map_location, options_.group);
  if (view.rank == 0) {
    logger("checkpoint")
        ->info("resumed from {} (step {}, epoch {}, batch {})", path, progress.step, progress.epoch,
               progress.batch_in_epoch);
  }
  return progress;
}

}  // namespace ddprun::checkpoint
