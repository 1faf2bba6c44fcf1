// Synchronous SGD on Fashion-MNIST, the "distributed training" example of PyTorch's
// "Writing Distributed Applications with PyTorch" tutorial made real: each rank trains a
// small convnet on its slice of the data (DataPartitioner, reshuffled every epoch), DDP
// averages the gradients, rank 0 shows a progress bar, and the test accuracy is measured
// across all ranks after every epoch. With --checkpoint-dir the run saves every
// --checkpoint-every steps and, started again (ddprun's restart after a failure, or by
// hand), continues from the newest checkpoint bit for bit.
//
//   ddprun --standalone --nproc_per_node=2 --max_restarts=1 --no_python build/bin/fashion_mnist
//          --epochs 3 --checkpoint-dir /tmp/ckpt --checkpoint-every 200
//
// --device auto (the default) trains on cuda:LOCAL_RANK (modulo the visible devices) where
// CUDA is, else on the CPU, and says which on its first line.
//
// Fault injection for tests: DDPRUN_CRASH_AT_STEP=k makes rank DDPRUN_CRASH_RANK (default:
// the last rank) exit with status 17 just before step k, on the first attempt only
// (TORCHELASTIC_RESTART_COUNT 0), as a worker dying mid-run would.

// The parts of <torch/torch.h> this file uses: all of it (every module, optimizer and data loader)
// costs about a quarter more compile time, the build's largest source.
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <unistd.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "common/env_names.h"
#include "common/env_reader.h"
#include "trainers/fashion_mnist_data.h"
#include "trainers/param_dump.h"
#include "trainers/progress_bar.h"
#include "worker_runtime/checkpoint/checkpoint.h"
#include "worker_runtime/ddp/distributed_data_parallel.h"
#include "worker_runtime/distributed.h"
#include "worker_runtime/error_record.h"

namespace dist = ddprun::dist;
namespace ckpt = ddprun::checkpoint;
using namespace ddprun::trainers;

namespace {

// Two 5x5 convolutions with max pooling and two fully connected layers (about 47k
// parameters): 90% test accuracy after 5 epochs of SGD with a cosine schedule, and cheap
// enough on one CPU core per rank.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5)))),
        fc1(register_module("fc1", torch::nn::Linear(32 * 4 * 4, 64))),
        fc2(register_module("fc2", torch::nn::Linear(64, 10))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);  // 16 x 12 x 12
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);  // 32 x 4 x 4
    x = torch::relu(fc1(x.flatten(1)));
    return torch::log_softmax(fc2(x), 1);
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

struct Options {
  std::string data_dir = kFashionMnistDir;
  int64_t epochs = 5;
  int64_t batch_size = 64;  // global: each rank takes batch_size / world
  double lr = 0.02;
  double momentum = 0.9;
  bool cosine = true;
  uint64_t seed = 1234;
  int64_t max_steps = 0;
  int64_t train_limit = 0;
  int64_t test_limit = 0;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int64_t log_every = 100;
  std::string dump_params;
  double min_accuracy = 0;
  std::string device = "auto";
  bool deterministic = false;
};

// The first `limit` samples (all when 0).
Dataset limited(Dataset data, int64_t limit) {
  if (limit > 0 && limit < data.size()) {
    data.images = data.images.narrow(0, 0, limit);
    data.labels = data.labels.narrow(0, 0, limit);
  }
  return data;
}

// Cosine decay from `base` to zero over the run: a function of the step alone, so a resumed
// run continues the same schedule.
double cosineRate(double base, int64_t step, int64_t total_steps) {
  return 0.5 * base * (1.0 + std::cos(M_PI * static_cast<double>(step) / static_cast<double>(total_steps)));
}

void setLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
}

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
  int64_t samples = 0;
};

// Every rank evaluates its contiguous share of the test set; the sums are all_reduced.
// Runs the bare module (not through DDP): evaluation needs no gradient synchronisation,
// and ranks may have different numbers of batches.
EvalResult evaluate(Net& model, const Dataset& test, int rank, int world, const at::Device& device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t begin = test.size() * rank / world;
  const int64_t end = test.size() * (rank + 1) / world;
  std::vector<int64_t> indices;
  for (int64_t i = begin; i < end; ++i) indices.push_back(i);
  double loss_sum = 0;
  int64_t correct = 0;
  for (size_t b = 0; b < indices.size(); b += 1000) {
    auto [x, y] = makeBatch(test, indices, b, std::min(indices.size(), b + 1000));
    x = x.to(device);
    y = y.to(device);
    auto out = model->forward(x);
    loss_sum += torch::nll_loss(out, y, {}, at::Reduction::Sum).item<double>();
    correct += out.argmax(1).eq(y).sum().item<int64_t>();
  }
  model->train();
  at::Tensor sums =
      torch::tensor({loss_sum, static_cast<double>(correct), static_cast<double>(end - begin)}, torch::kDouble);
  dist::all_reduce(sums);
  const double n = sums[2].item<double>();
  return {sums[0].item<double>() / n, sums[1].item<double>() / n, static_cast<int64_t>(n)};
}

int train(const Options& opt) {
  const at::Device device = ddprun::ddp::device_from_choice(opt.device);
  if (device.is_cuda()) c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(device);  // torch.cuda.set_device
  if (opt.deterministic) {
    // Bitwise reproducible on the GPU (resume tests): cuBLAS needs a fixed workspace for it.
    ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setBenchmarkCuDNN(false);
  }
  dist::init_process_group();  // auto: NCCL for the CUDA gradients, the host backend for the rest
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();
  namespace env = ddprun::env;
  const int restart_count = env::integerOr(env::kRestartCount, 0, 0, INT_MAX);
  const int64_t crash_at = env::integerOr<int64_t>(env::kCrashAtStep, 0, 0, INT64_MAX);
  const int crash_rank = env::integerOr(env::kCrashRank, world - 1, 0, world - 1);
  if (opt.batch_size % world != 0) {
    throw ddprun::UsageError("--batch-size " + std::to_string(opt.batch_size) + " is not a multiple of the " +
                             std::to_string(world) + " ranks");
  }
  const int64_t local_batch = opt.batch_size / world;

  const auto t0 = std::chrono::steady_clock::now();
  const Dataset train_set = limited(loadFashionMnist(opt.data_dir, true), opt.train_limit);
  const Dataset test_set = limited(loadFashionMnist(opt.data_dir, false), opt.test_limit);
  const DataPartitioner partitioner(train_set.size(), world, rank, opt.seed);
  const int64_t steps_per_epoch = (partitioner.sliceSize() + local_batch - 1) / local_batch;
  int64_t total_steps = opt.epochs * steps_per_epoch;
  if (opt.max_steps > 0) total_steps = std::min(total_steps, opt.max_steps);

  torch::manual_seed(opt.seed);
  Net net;  // initialised on the CPU, so every device starts from the same model
  net->to(device);
  ddprun::ddp::DDPOptions ddp_options;
  if (device.is_cuda()) ddp_options.device_ids = {device.index()};
  ddprun::ddp::DistributedDataParallel model(net, ddp_options);
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(opt.lr).momentum(opt.momentum));

  ckpt::TrainingProgress progress{.data_seed = opt.seed};
  std::optional<ckpt::CheckpointManager> checkpoints;
  if (!opt.checkpoint_dir.empty()) {
    checkpoints.emplace(ckpt::CheckpointManagerOptions{.directory = opt.checkpoint_dir, .map_location = device});
    if (auto resumed = checkpoints->resumeLatest(*net, &optimizer)) {
      progress = *resumed;
      if (progress.data_seed != opt.seed) {
        throw ddprun::UsageError("checkpoint in " + opt.checkpoint_dir + " was made with --seed " +
                                 std::to_string(progress.data_seed) + ", this run has " + std::to_string(opt.seed));
      }
      if (rank == 0) {
        std::printf("resumed at step %lld (epoch %lld, batch %lld), restart %lld\n",
                    static_cast<long long>(progress.step), static_cast<long long>(progress.epoch + 1),
                    static_cast<long long>(progress.batch_in_epoch), static_cast<long long>(restart_count));
      }
    }
  }
  if (rank == 0) {
    std::printf(
        "fashion_mnist: %d ranks, %lld train / %lld test samples, batch %lld (%lld per rank), "
        "%lld steps per epoch, %lld steps, data loaded in %.2f s, training on %s\n",
        world, static_cast<long long>(train_set.size()), static_cast<long long>(test_set.size()),
        static_cast<long long>(opt.batch_size), static_cast<long long>(local_batch),
        static_cast<long long>(steps_per_epoch), static_cast<long long>(total_steps),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), device.str().c_str());
    std::fflush(stdout);
  }

  std::optional<ProgressBar> bar;
  if (rank == 0) {
    bar.emplace(ProgressBarOptions{.total_steps = total_steps,
                                   .first_step = progress.step,
                                   .samples_per_step = opt.batch_size,
                                   .every = opt.log_every,
                                   .tty = ProgressBar::isTerminal(STDOUT_FILENO)});
  }
  const auto train_start = std::chrono::steady_clock::now();
  EvalResult last_eval;
  while (progress.step < total_steps && progress.epoch < opt.epochs) {
    const std::vector<int64_t> order = partitioner.epochIndices(progress.epoch);
    double epoch_loss = 0;
    int64_t epoch_batches = 0;
    for (int64_t b = progress.batch_in_epoch; b < steps_per_epoch && progress.step < total_steps; ++b) {
      if (crash_at == progress.step + 1 && restart_count == 0 && rank == crash_rank) {
        std::fprintf(stderr, "fault injection: rank %d exits before step %lld (DDPRUN_CRASH_AT_STEP)\n", rank,
                     static_cast<long long>(crash_at));
        std::fflush(stderr);
        std::_Exit(17);
      }
      const size_t begin = static_cast<size_t>(b * local_batch);
      auto [x, y] =
          makeBatch(train_set, order, begin, std::min(order.size(), begin + static_cast<size_t>(local_batch)));
      if (opt.cosine) setLearningRate(optimizer, cosineRate(opt.lr, progress.step, total_steps));
      optimizer.zero_grad();
      auto loss = torch::nll_loss(model(x), y.to(device));  // DDP moves x to device_ids[0]
      loss.backward();
      optimizer.step();

      const double loss_value = loss.item<double>();
      epoch_loss += loss_value;
      ++epoch_batches;
      ++progress.step;
      progress.batch_in_epoch = b + 1;
      if (bar) bar->update(progress.step, loss_value);
      if (checkpoints && opt.checkpoint_every > 0 && progress.step % opt.checkpoint_every == 0) {
        checkpoints->save(*net, &optimizer, progress);
      }
    }
    if (progress.batch_in_epoch < steps_per_epoch) break;  // --max-steps ended the run mid-epoch

    last_eval = evaluate(net, test_set, rank, world, device);
    at::Tensor train_loss = torch::tensor({epoch_loss, static_cast<double>(epoch_batches)}, torch::kDouble);
    dist::all_reduce(train_loss);
    if (bar) {
      char line[256];
      std::snprintf(
          line, sizeof line,
          "epoch %lld/%lld: train loss %.4f, test loss %.4f, test accuracy %.2f%% (%lld samples), %.1f s",
          static_cast<long long>(progress.epoch + 1), static_cast<long long>(opt.epochs),
          train_loss[1].item<double>() > 0 ? train_loss[0].item<double>() / train_loss[1].item<double>() : 0.0,
          last_eval.loss, 100 * last_eval.accuracy, static_cast<long long>(last_eval.samples),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count());
      bar->message(line);
    }
    ++progress.epoch;
    progress.batch_in_epoch = 0;
  }
  if (bar) bar->finish();

  if (rank == 0) {
    std::printf("done: %lld steps in %.1f s", static_cast<long long>(progress.step),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count());
    if (last_eval.samples > 0) std::printf(", final test accuracy %.2f%%", 100 * last_eval.accuracy);
    std::printf("\n");
  }
  if (opt.min_accuracy > 0 && 100 * last_eval.accuracy < opt.min_accuracy) {
    char message[160];
    if (last_eval.samples == 0) {
      std::snprintf(message, sizeof message, "--min-accuracy %.2f%%: no epoch ended, so no test accuracy was measured",
                    opt.min_accuracy);
    } else {
      std::snprintf(message, sizeof message, "final test accuracy %.2f%% is below --min-accuracy %.2f%%",
                    100 * last_eval.accuracy, opt.min_accuracy);
    }
    throw ddprun::DdprunError(message);
  }
  if (!opt.dump_params.empty()) {
    const std::string digest = dumpParameters(*net, opt.dump_params, rank);
    std::printf("rank %d params fnv1a64=%s\n", rank, digest.c_str());
  }
  std::fflush(stdout);
  dist::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"Synchronous data-parallel SGD on Fashion-MNIST (run under ddprun)", "fashion_mnist"};
  app.add_option("--data-dir", opt.data_dir, "directory with the gzip IDX files")->capture_default_str();
  app.add_option("--epochs", opt.epochs, "epochs")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--batch-size", opt.batch_size, "global batch size (split over ranks)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", opt.lr, "SGD learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--cosine", opt.cosine, "decay the learning rate to 0 along a cosine (false: constant)")
      ->capture_default_str();
  app.add_option("--momentum", opt.momentum, "SGD momentum")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", opt.seed, "seed of the initial model and the data order")->capture_default_str();
  app.add_option("--max-steps", opt.max_steps, "stop after this many steps (0: all epochs)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--train-limit", opt.train_limit, "use only the first N training samples (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--test-limit", opt.test_limit, "use only the first N test samples (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-dir", opt.checkpoint_dir, "save checkpoints here and resume from the newest");
  app.add_option("--checkpoint-every", opt.checkpoint_every, "save every N steps (needs --checkpoint-dir)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--log-every", opt.log_every, "without a terminal, a progress line every N steps")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--dump-params", opt.dump_params, "write each rank's final parameters to DIR/params_rank<r>.bin");
  app.add_option("--min-accuracy", opt.min_accuracy, "fail (exit 1) when the final test accuracy is below this %")
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--device", opt.device, "auto (a GPU per rank where CUDA is, else the CPU), cpu or cuda")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_flag("--deterministic", opt.deterministic, "deterministic algorithms only (bitwise reproducible on a GPU)");
  try {
    app.parse(argc, argv);
    if (opt.checkpoint_every > 0 && opt.checkpoint_dir.empty()) {
      throw CLI::ValidationError("--checkpoint-every", "needs --checkpoint-dir");
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return ddprun::runtime::recordErrors([&] { return train(opt); });
}
