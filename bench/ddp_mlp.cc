// ddprun's side of bench/ddp_bench: the MLP of ../shared/anchors/ddp_mlp.py (784-1024-1024-10,
// batch 64 per rank, SGD lr 0.01 momentum 0.9, cross-entropy, seeded synthetic data) trained
// with ddprun::ddp::DistributedDataParallel, timed the same way (median step after 5 warm-up
// steps). Rank 0 prints:
//   ddprun-ddp n=N steps=S median_step_s=.. samples_per_s=.. final_loss=..
// Usage (under ddprun): ddp_mlp [steps]
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "worker_runtime/ddp/distributed_data_parallel.h"
#include "worker_runtime/distributed.h"

namespace dist = ddprun::dist;

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 50;
  if (steps < 6) {
    std::cerr << "ddp_mlp: steps must be at least 6 (5 are warm-up)" << std::endl;
    return 2;
  }
  try {
    dist::init_process_group();
    const int rank = dist::get_rank();
    const int world = dist::get_world_size();
    torch::manual_seed(0);
    torch::nn::Sequential net(torch::nn::Linear(784, 1024), torch::nn::ReLU(), torch::nn::Linear(1024, 1024),
                              torch::nn::ReLU(), torch::nn::Linear(1024, 10));
    ddprun::ddp::DistributedDataParallel model(net);
    torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 + rank));
    std::vector<double> times;
    torch::Tensor loss;
    for (int s = 0; s < steps; ++s) {
      auto x = torch::randn({64, 784}, gen);
      auto y = torch::randint(0, 10, {64}, gen);
      const auto t0 = std::chrono::steady_clock::now();
      opt.zero_grad();
      loss = torch::nn::functional::cross_entropy(model(x), y);
      loss.backward();
      opt.step();
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    times.erase(times.begin(), times.begin() + 5);
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    if (rank == 0) {
      std::cout << fmt::format("ddprun-ddp n={} steps={} median_step_s={:.5f} samples_per_s={:.1f} final_loss={:.4f}",
                               world, steps, median, 64 * world / median, loss.item<double>())
                << std::endl;
    }
    dist::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ddp_mlp: " << e.what() << std::endl;
    return 1;
  }
}
