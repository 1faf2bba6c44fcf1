// bench/recovery_compare's trainer: an MLP of about --params parameters (20M by default)
// trained with the runtime's DDP on the host backend, a checkpoint every --checkpoint-every
// steps and resumeLatest at every start, so that it recovers in either mode: with
// --recovery=restart every rank reloads the newest checkpoint and replays the steps since;
// with --recovery=in-job a replacement takes its state from a survivor inside resumeLatest.
// The chaos trainer (tests/chaos/) has the same loop around a model of 700 parameters, too
// small to show what a restart reloads.
//
// Each process appends to LOG_DIR/steps.<rank>.<pid> (flushed per line; t: wall clock, ms):
//   start rank=R world=W resumed=K t=T      K: the step it resumed from (0: none)
//   step rank=R step=S t=T                  after optimizer step S
//   done rank=R step=S sum=H t=T            H: FNV-1a 64 of the parameters' bytes
//
//   ddprun ... --no_python recovery_trainer --steps 30 --checkpoint-dir CK --log-dir LOGS
#include <torch/torch.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>

#include "common/error.h"
#include "trainers/param_dump.h"
#include "worker_runtime/checkpoint/checkpoint.h"
#include "worker_runtime/ddp/distributed_data_parallel.h"
#include "worker_runtime/distributed.h"
#include "worker_runtime/error_record.h"

namespace dist = ddprun::dist;
namespace ckpt = ddprun::checkpoint;

namespace {

constexpr int64_t kInputs = 256;
constexpr int64_t kOutputs = 256;

// Two hidden layers of `width`: about width^2 + (inputs + outputs + 2) * width parameters.
int64_t widthFor(int64_t params) {
  const double b = kInputs + kOutputs + 2;
  return std::max<int64_t>(1, static_cast<int64_t>((-b + std::sqrt(b * b + 4.0 * static_cast<double>(params))) / 2));
}

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t width)
      : fc1(register_module("fc1", torch::nn::Linear(kInputs, width))),
        fc2(register_module("fc2", torch::nn::Linear(width, width))),
        fc3(register_module("fc3", torch::nn::Linear(width, kOutputs))) {}
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::tanh(fc2(torch::tanh(fc1(x))))); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Net);

struct Options {
  int64_t steps = 30;
  int64_t params = 20'000'000;
  int64_t batch_size = 16;  // global; a multiple of the world size
  int64_t checkpoint_every = 5;
  int64_t timeout_s = 120;
  std::string checkpoint_dir;
  std::string log_dir;
};

int64_t nowMs() { return std::chrono::system_clock::now().time_since_epoch() / std::chrono::milliseconds(1); }

int train(const Options& opt) {
  dist::init_process_group(dist::InitOptions{.backend = "cpu", .timeout = std::chrono::seconds(opt.timeout_s)});
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();
  if (opt.batch_size % world != 0) {
    throw ddprun::UsageError("--batch-size " + std::to_string(opt.batch_size) + " is not a multiple of the " +
                             std::to_string(world) + " ranks");
  }
  const std::string path = opt.log_dir + "/steps." + std::to_string(rank) + "." + std::to_string(::getpid());
  std::ofstream log(path, std::ios::app);
  if (!log) throw ddprun::DdprunError("recovery_trainer: cannot open " + path);
  auto line = [&](const std::string& text) { log << text << " t=" << nowMs() << std::endl; };

  torch::manual_seed(7);
  Net net(widthFor(opt.params));
  ddprun::ddp::DistributedDataParallel model(net);
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  ckpt::CheckpointManager checkpoints(ckpt::CheckpointManagerOptions{.directory = opt.checkpoint_dir});
  ckpt::TrainingProgress progress{.data_seed = 7};
  if (auto resumed = checkpoints.resumeLatest(*net, &optimizer)) progress = *resumed;
  line("start rank=" + std::to_string(rank) + " world=" + std::to_string(world) +
       " resumed=" + std::to_string(progress.step));

  const int64_t local = opt.batch_size / world;
  while (progress.step < opt.steps) {
    // The global batch of the step, the same on every rank whatever the world size.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000003ULL + static_cast<uint64_t>(progress.step));
    torch::Tensor x = at::randn({opt.batch_size, kInputs}, gen).narrow(0, rank * local, local);
    optimizer.zero_grad();
    torch::mse_loss(model(x), torch::sin(x)).backward();
    optimizer.step();
    ++progress.step;
    line("step rank=" + std::to_string(rank) + " step=" + std::to_string(progress.step));
    if (progress.step % opt.checkpoint_every == 0 || progress.step == opt.steps) {
      checkpoints.save(*net, &optimizer, progress);
    }
  }
  line("done rank=" + std::to_string(rank) + " step=" + std::to_string(progress.step) +
       " sum=" + ddprun::trainers::fnv1a64Hex(ddprun::trainers::parameterBytes(*net)));
  dist::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"bench/recovery_compare's trainer: a ~20M-parameter MLP on the runtime's DDP", "recovery_trainer"};
  app.add_option("--steps", opt.steps, "optimizer steps of the whole run")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--params", opt.params, "the model's size, parameters (about)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-size", opt.batch_size, "global batch (split over the ranks)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--checkpoint-every", opt.checkpoint_every, "save every N steps")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--timeout", opt.timeout_s, "collectives' timeout, seconds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--checkpoint-dir", opt.checkpoint_dir, "checkpoints (shared by every rank)")->required();
  app.add_option("--log-dir", opt.log_dir, "where each process appends its step log")
      ->required()
      ->check(CLI::ExistingDirectory);
  CLI11_PARSE(app, argc, argv);
  return ddprun::runtime::recordErrors([&] { return train(opt); });
}
