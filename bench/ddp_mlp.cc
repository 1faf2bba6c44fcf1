// ddprun's side of bench/ddp_bench: the MLP of ../shared/anchors/ddp_mlp.py (784-1024-1024-10,
// batch 64 per rank, SGD lr 0.01 momentum 0.9, cross-entropy, seeded synthetic data) trained
// with ddprun::ddp::DistributedDataParallel, timed the same way (median step after 5 warm-up
// steps). Rank 0 prints:
//   ddprun-ddp n=N steps=S median_step_s=.. samples_per_s=.. final_loss=..
// Usage (under ddprun): ddp_mlp [steps] [--device cuda] [--width W] [--batch B]
// --device cuda (bench/ddp_cuda_compare, against bench/ddp_mlp_torch_cuda.py): the model on
// cuda:(LOCAL_RANK modulo the visible devices) with device_ids, widened with --width (hidden
// units, default 1024) and --batch (per rank, default 64) so the GPU has work; each step is
// timed between two synchronizations of the current stream, and the line says device=cuda.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/env_reader.h"
#include "worker_runtime/ddp/distributed_data_parallel.h"
#include "worker_runtime/distributed.h"

namespace dist = ddprun::dist;

int main(int argc, char** argv) {
  int steps = 50;
  int64_t width = 1024, batch = 64;
  bool cuda = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--device" && i + 1 < argc) {
      cuda = std::string(argv[++i]) == "cuda";
    } else if (arg == "--width" && i + 1 < argc) {
      width = ddprun::env::parseInteger("--width", argv[++i], 1, INT32_MAX);
    } else if (arg == "--batch" && i + 1 < argc) {
      batch = ddprun::env::parseInteger("--batch", argv[++i], 1, INT32_MAX);
    } else {
      steps = static_cast<int>(ddprun::env::parseInteger("steps", arg, 0, INT32_MAX));
    }
  }
  if (steps < 6) {
    std::cerr << "ddp_mlp: steps must be at least 6 (5 are warm-up)" << std::endl;
    return 2;
  }
  try {
    dist::init_process_group();
    const int rank = dist::get_rank();
    const int world = dist::get_world_size();
    const at::Device device = cuda ? ddprun::ddp::default_device() : at::Device(at::kCPU);
    if (cuda && !device.is_cuda()) throw std::runtime_error("--device cuda: no CUDA device is visible");
    if (cuda) c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(device);
    // The current stream: the step's end is when it has drained (ops and the last bucket).
    auto sync = [&] {
      if (cuda) c10::impl::getDeviceGuardImpl(at::kCUDA)->getStream(device).synchronize();
    };
    torch::manual_seed(0);
    torch::nn::Sequential net(torch::nn::Linear(784, width), torch::nn::ReLU(), torch::nn::Linear(width, width),
                              torch::nn::ReLU(), torch::nn::Linear(width, 10));
    net->to(device);
    ddprun::ddp::DDPOptions options;
    if (cuda) options.device_ids = {device.index()};
    ddprun::ddp::DistributedDataParallel model(net, options);
    torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 + rank));
    std::vector<double> times;
    torch::Tensor loss;
    for (int s = 0; s < steps; ++s) {
      auto x = torch::randn({batch, 784}, gen).to(device);
      auto y = torch::randint(0, 10, {batch}, gen).to(device);
      sync();
      const auto t0 = std::chrono::steady_clock::now();
      opt.zero_grad();
      loss = torch::nn::functional::cross_entropy(model(x), y);
      loss.backward();
      opt.step();
      sync();
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    times.erase(times.begin(), times.begin() + 5);
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    if (rank == 0) {
      std::cout << fmt::format("ddprun-ddp n={} steps={} median_step_s={:.5f} samples_per_s={:.1f} final_loss={:.4f}{}",
                               world, steps, median, static_cast<double>(batch * world) / median, loss.item<double>(),
                               cuda ? fmt::format(" device=cuda width={} batch={}", width, batch) : "")
                << std::endl;
    }
    dist::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ddp_mlp: " << e.what() << std::endl;
    return 1;
  }
}
