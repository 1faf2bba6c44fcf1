// The chaos soak's trainer: a small deterministic model trained with DDP on the runtime's host
// backend, checkpointing every few steps and resuming from the newest checkpoint on every
// start, so that a job killed and re-formed at any moment loses no step. Every rank appends
// one line per optimizer step it applies to its own log, which the soak reads back to check
// that the steps form an unbroken sequence and that runs at the same world size agree bit
// for bit.
//
// The data do not depend on the world size: the global batch of step s is drawn from a
// generator seeded with (seed, s), and rank r of W takes rows [r*B/W, (r+1)*B/W). A job that
// shrinks or grows mid-run trains on the same samples; only the order of the sums differs.
//
// Log lines (LOG_DIR/steps.<attempt>.<rank>, one file per process, appended and flushed):
//   start attempt=A rank=R world=W resumed=K     K: the checkpoint's step (0: none)
//   step attempt=A rank=R world=W step=S sum=H   after optimizer step S; H: FNV-1a 64 of the
//                                                parameters' bytes
//   saved attempt=A rank=R step=S                rank 0, once checkpoint S is complete
//   done attempt=A rank=R step=S sum=H           the last step reached
// and each line ends with t=<wall clock, ms>.
// The attempt is rank 0's wall clock in nanoseconds when the group formed, broadcast to every
// rank: unique per (re-)formed group and ordered in time.
//
//   ddprun ... --no_python chaos_trainer --steps 600 --checkpoint-dir CK --log-dir LOGS
#include <torch/torch.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "common/error.h"
#include "trainers/param_dump.h"
#include "worker_runtime/checkpoint/checkpoint.h"
#include "worker_runtime/ddp/distributed_data_parallel.h"
#include "worker_runtime/distributed.h"
#include "worker_runtime/error_record.h"

namespace dist = ddprun::dist;
namespace ckpt = ddprun::checkpoint;

namespace {

constexpr int64_t kInputs = 16;
constexpr int64_t kOutputs = 4;

struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(kInputs, 32))),
        fc2(register_module("fc2", torch::nn::Linear(32, kOutputs))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

struct Options {
  int64_t steps = 600;
  int64_t batch_size = 24;  // global; a multiple of every world size the job may take (1..4)
  int64_t checkpoint_every = 5;
  int64_t step_ms = 0;  // "compute" per step, so a soak has time to hit the job mid-run
  uint64_t seed = 7;
  int64_t timeout_s = 120;
  std::string checkpoint_dir;
  std::string log_dir;
};

// The global batch of `step`: the same on every rank and at every world size.
std::pair<torch::Tensor, torch::Tensor> globalBatch(uint64_t seed, int64_t step, int64_t batch) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ULL + static_cast<uint64_t>(step));
  torch::Tensor x = at::randn({batch, kInputs}, gen);
  torch::Tensor y = torch::sin(x.narrow(1, 0, kOutputs) * 2.0) + 0.5 * x.narrow(1, kOutputs, kOutputs);
  return {x, y};
}

class StepLog {
 public:
  StepLog(const std::string& dir, int64_t attempt, int rank)
      : out_(dir + "/steps." + std::to_string(attempt) + "." + std::to_string(rank), std::ios::app),
        prefix_("attempt=" + std::to_string(attempt) + " rank=" + std::to_string(rank)) {
    if (!out_) throw ddprun::DdprunError("chaos_trainer: cannot open the step log in " + dir);
  }
  void line(const std::string& kind, const std::string& rest) {
    const auto now = std::chrono::system_clock::now().time_since_epoch() / std::chrono::milliseconds(1);
    out_ << kind << ' ' << prefix_ << ' ' << rest << " t=" << now << '\n';
    out_.flush();
  }

 private:
  std::ofstream out_;
  std::string prefix_;
};

int train(const Options& opt) {
  dist::init_process_group(dist::InitOptions{.backend = "cpu", .timeout = std::chrono::seconds(opt.timeout_s)});
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();
  if (opt.batch_size % world != 0) {
    throw ddprun::UsageError("--batch-size " + std::to_string(opt.batch_size) + " is not a multiple of the " +
                             std::to_string(world) + " ranks");
  }
  at::Tensor attempt_tensor = torch::tensor(
      {static_cast<int64_t>(std::chrono::system_clock::now().time_since_epoch() / std::chrono::nanoseconds(1))},
      torch::kInt64);
  dist::broadcast(attempt_tensor, 0);
  const int64_t attempt = attempt_tensor.item<int64_t>();
  StepLog log(opt.log_dir, attempt, rank);

  torch::manual_seed(static_cast<int64_t>(opt.seed));
  Net net;
  ddprun::ddp::DistributedDataParallel model(net);
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  ckpt::CheckpointManager checkpoints(ckpt::CheckpointManagerOptions{.directory = opt.checkpoint_dir});
  ckpt::TrainingProgress progress{.data_seed = opt.seed};
  if (auto resumed = checkpoints.resumeLatest(*net, &optimizer)) progress = *resumed;
  log.line("start", "world=" + std::to_string(world) + " resumed=" + std::to_string(progress.step));

  const int64_t local = opt.batch_size / world;
  std::string sum;
  while (progress.step < opt.steps) {
    if (opt.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(opt.step_ms));
    auto [x, y] = globalBatch(opt.seed, progress.step, opt.batch_size);
    optimizer.zero_grad();
    auto loss = torch::mse_loss(model(x.narrow(0, rank * local, local)), y.narrow(0, rank * local, local));
    loss.backward();
    optimizer.step();
    ++progress.step;
    sum = ddprun::trainers::fnv1a64Hex(ddprun::trainers::parameterBytes(*net));
    log.line("step", "world=" + std::to_string(world) + " step=" + std::to_string(progress.step) + " sum=" + sum);
    if (progress.step % opt.checkpoint_every == 0 || progress.step == opt.steps) {
      checkpoints.save(*net, &optimizer, progress);
      if (rank == 0) log.line("saved", "step=" + std::to_string(progress.step));
    }
  }
  if (sum.empty()) sum = ddprun::trainers::fnv1a64Hex(ddprun::trainers::parameterBytes(*net));
  log.line("done", "step=" + std::to_string(progress.step) + " sum=" + sum);
  dist::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"The chaos soak's deterministic trainer (run under ddprun)", "chaos_trainer"};
  app.add_option("--steps", opt.steps, "optimizer steps of the whole run")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-size", opt.batch_size, "global batch (split over the ranks)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--checkpoint-every", opt.checkpoint_every, "save every N steps")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--step-ms", opt.step_ms, "sleep this long before each step")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", opt.seed, "seed of the model and the data")->capture_default_str();
  app.add_option("--timeout", opt.timeout_s, "collectives' timeout, seconds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--checkpoint-dir", opt.checkpoint_dir, "checkpoints (shared by every rank)")->required();
  app.add_option("--log-dir", opt.log_dir, "where each rank appends its step log")
      ->required()
      ->check(CLI::ExistingDirectory);
  CLI11_PARSE(app, argc, argv);
  return ddprun::runtime::recordErrors([&] { return train(opt); });
}
