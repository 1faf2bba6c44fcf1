// The examples of PyTorch's "Getting Started with Distributed Data Parallel" tutorial, in
// C++ on ddprun's DDP, one per subcommand:
//
//   basic           ToyModel wrapped in DDP, SGD steps on random data (elastic_ddp.py too)
//   checkpoint      rank 0 saves, a barrier, every rank loads with a device mapping, trains on
//   model_parallel  ToyMpModel spread over two devices per process, wrapped in DDP without
//                   device ids (with one GPU per rank: that GPU and the CPU; without CUDA,
//                   two CPU stand-ins)
//
//   ddprun --standalone --nproc_per_node=2 --no_python build/bin/ddp_tutorial basic
//
// Each rank starts from a different random model and draws different data (seeded by its
// rank), so equal parameters at the end show that DDP's initial broadcast and gradient
// averaging both happened. Every rank prints its parameters' digest; --dump-params DIR
// also writes them for a byte-for-byte comparison.
#include <torch/torch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <string>

#include "common/env_names.h"
#include "common/env_reader.h"
#include "trainers/param_dump.h"
#include "worker_runtime/checkpoint/checkpoint.h"
#include "worker_runtime/ddp/distributed_data_parallel.h"
#include "worker_runtime/distributed.h"
#include "worker_runtime/error_record.h"

namespace dist = ddprun::dist;
namespace ckpt = ddprun::checkpoint;
using ddprun::ddp::DistributedDataParallel;

namespace {

struct ToyModelImpl : torch::nn::Module {
  ToyModelImpl()
      : net1(register_module("net1", torch::nn::Linear(10, 10))),
        net2(register_module("net2", torch::nn::Linear(10, 5))) {}
  torch::Tensor forward(const torch::Tensor& x) { return net2(torch::relu(net1(x))); }
  torch::nn::Linear net1, net2;
};
TORCH_MODULE(ToyModel);

struct ToyMpModelImpl : torch::nn::Module {
  ToyMpModelImpl(torch::Device dev0, torch::Device dev1)
      : dev0(dev0),
        dev1(dev1),
        net1(register_module("net1", torch::nn::Linear(10, 10))),
        net2(register_module("net2", torch::nn::Linear(10, 5))) {
    net1->to(dev0);
    net2->to(dev1);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(net1(x.to(dev0)));
    return net2(x.to(dev1));
  }
  torch::Device dev0, dev1;
  torch::nn::Linear net1, net2;
};
TORCH_MODULE(ToyMpModel);

struct Options {
  std::string demo;
  int steps = 5;
  std::string dump_params;
  std::string checkpoint_path;
};

int localRank() { return ddprun::env::integerOr(ddprun::env::kLocalRank, 0, 0, INT_MAX); }

int localWorldSize() { return ddprun::env::integerOr(ddprun::env::kLocalWorldSize, 1, 1, INT_MAX); }

int gpuCount() { return static_cast<int>(torch::cuda::device_count()); }

// This process's device, as the tutorial's `.to(rank)`: cuda:(LOCAL_RANK modulo the visible
// devices) where CUDA is (several ranks may share one GPU), else the CPU (always, with
// Debian's CPU-only LibTorch).
torch::Device localDevice() { return ddprun::ddp::default_device(); }

// `steps` rounds of the tutorial's step: zero_grad, forward on random input, MSE against
// random labels (on the output's device), backward, step. Drawn on the CPU, so the
// numbers are the same whatever the device.
template <typename M>
void trainSteps(DistributedDataParallel<M>& ddp_model, torch::optim::Optimizer& optimizer, int steps,
                torch::Device input_device, torch::Device label_device) {
  for (int i = 0; i < steps; ++i) {
    optimizer.zero_grad();
    auto outputs = ddp_model(torch::randn({20, 10}).to(input_device));
    auto labels = torch::randn({20, 5}).to(label_device);
    torch::mse_loss(outputs, labels).backward();
    optimizer.step();
  }
}

void report(const torch::nn::Module& model, const Options& opt, const std::string& demo) {
  const int rank = dist::get_rank();
  const std::string digest = opt.dump_params.empty()
                                 ? ddprun::trainers::fnv1a64Hex(ddprun::trainers::parameterBytes(model))
                                 : ddprun::trainers::dumpParameters(model, opt.dump_params, rank);
  std::printf("rank %d: %s done, params fnv1a64=%s\n", rank, demo.c_str(), digest.c_str());
  std::fflush(stdout);
}

void demoBasic(const Options& opt) {
  const int rank = dist::get_rank();
  std::printf("Running basic DDP example on rank %d.\n", rank);
  const torch::Device device = localDevice();
  ToyModel model;
  model->to(device);
  DistributedDataParallel ddp_model(model);
  torch::optim::SGD optimizer(ddp_model.parameters(), 0.001);
  trainSteps(ddp_model, optimizer, opt.steps, device, device);
  report(*model, opt, "basic");
}

void demoCheckpoint(const Options& opt) {
  const int rank = dist::get_rank();
  std::printf("Running DDP checkpoint example on rank %d.\n", rank);
  ToyModel model;
  model->to(localDevice());
  DistributedDataParallel ddp_model(model);

  std::string path = opt.checkpoint_path;
  if (path.empty()) {
    const std::string run_id = ddprun::env::stringOr(ddprun::env::kRunId, "local");
    path = (std::filesystem::temp_directory_path() / ("ddp_tutorial_" + run_id + ".ckpt")).string();
  }
  // Every process holds the same parameters (DDP broadcast them), so rank 0 saving is
  // enough; save() ends with a barrier, so nobody loads before the file is complete.
  ckpt::save(path, *model, nullptr, {});
  // The tutorial maps cuda:0 to this rank's device: here every tensor is materialized on
  // this process's device, whatever device rank 0 saved from.
  const torch::Device device = localDevice();
  // Scramble the local copy first, so equal parameters afterwards prove the load worked.
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.uniform_(-1, 1);
  }
  ckpt::load(path, *model, nullptr, device);

  torch::optim::SGD optimizer(ddp_model.parameters(), 0.001);
  trainSteps(ddp_model, optimizer, opt.steps, device, device);
  // No barrier needed before removing the file: the all_reduces of the steps above
  // already ordered every rank's load before this point.
  if (rank == 0) std::filesystem::remove(path);
  report(*model, opt, "checkpoint");
}

void demoModelParallel(const Options& opt) {
  const int rank = dist::get_rank();
  std::printf("Running DDP with model parallel example on rank %d.\n", rank);
  // Two GPUs per process where there are enough; with fewer, this rank's GPU and the CPU (a
  // model still spread over two devices); without CUDA, two CPU "devices".
  const bool two_gpus = gpuCount() >= 2 * localWorldSize();
  const torch::Device dev0 =
      two_gpus ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(2 * localRank())) : localDevice();
  const torch::Device dev1 = two_gpus ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(2 * localRank() + 1))
                                      : torch::Device(torch::kCPU);
  ToyMpModel mp_model(dev0, dev1);
  DistributedDataParallel ddp_mp_model(mp_model);
  torch::optim::SGD optimizer(ddp_mp_model.parameters(), 0.001);
  trainSteps(ddp_mp_model, optimizer, opt.steps, torch::kCPU, dev1);  // forward moves inputs; outputs on dev1
  report(*mp_model, opt, "model_parallel");
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"PyTorch's DDP tutorial examples on ddprun (run under ddprun)", "ddp_tutorial"};
  app.add_option("demo", opt.demo, "basic, checkpoint or model_parallel")
      ->required()
      ->check(CLI::IsMember({"basic", "checkpoint", "model_parallel"}));
  app.add_option("--steps", opt.steps, "training steps")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--dump-params", opt.dump_params, "write each rank's final parameters to DIR/params_rank<r>.bin");
  app.add_option("--checkpoint-path", opt.checkpoint_path,
                 "checkpoint file of the checkpoint demo (default: in $TMPDIR)");
  CLI11_PARSE(app, argc, argv);

  return ddprun::runtime::recordErrors([&] {
    dist::init_process_group();
    // A different model and different data on every rank: DDP must make them agree.
    torch::manual_seed(1000 + dist::get_rank());
    if (opt.demo == "basic") demoBasic(opt);
    if (opt.demo == "checkpoint") demoCheckpoint(opt);
    if (opt.demo == "model_parallel") demoModelParallel(opt);
    dist::destroy_process_group();
    return 0;
  });
}
