// Checkpoints across devices, on a GPU machine (ctest label gpu), one process: a model saved
// from CUDA loads onto the CPU and back with map_location as torch.load's does (cuda:N to
// cuda:M where there are two devices), each parameter keeping its own device, and the CUDA
// generators' states round-trip through a checkpoint so the draws after a load repeat the draws
// after the save. Prints "ok: <check>" per check; exits 1 at the first failure.
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "worker_runtime/checkpoint/checkpoint.h"
#include "worker_runtime/error_record.h"

namespace ckpt = ddprun::checkpoint;

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() : fc(register_module("fc", torch::nn::Linear(16, 8))) {}
  torch::nn::Linear fc;
};
TORCH_MODULE(Net);

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("FAILED: " + what);
  std::printf("ok: %s\n", what.c_str());
}

bool sameValues(Net& a, Net& b) {
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    if (!torch::equal(pa[i].cpu(), pb[i].cpu())) return false;
  }
  return true;
}

bool allOn(Net& net, const torch::Device& device) {
  for (const auto& p : net->parameters()) {
    if (p.device() != device) return false;
  }
  return true;
}

int run() {
  if (!torch::cuda::is_available()) throw std::runtime_error("no CUDA device is visible");
  const auto dir = std::filesystem::temp_directory_path() / ("ddprun_ckpt_gpu_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "model.ckpt").string();
  const torch::Device cuda0(torch::kCUDA, 0);

  torch::manual_seed(1);
  Net saved;
  saved->to(cuda0);
  ckpt::saveFile(path, *saved, nullptr, {});

  Net on_cpu;  // different initial values
  ckpt::loadFile(path, *on_cpu, nullptr, torch::kCPU);
  check(allOn(on_cpu, torch::kCPU) && sameValues(on_cpu, saved), "a model saved from cuda:0 loads onto the CPU");

  Net back;
  back->to(cuda0);
  ckpt::saveFile(path, *on_cpu, nullptr, {});
  ckpt::loadFile(path, *back, nullptr, cuda0);
  check(allOn(back, cuda0) && sameValues(back, saved), "a model saved from the CPU loads onto cuda:0");

  if (torch::cuda::device_count() >= 2) {
    const torch::Device cuda1(torch::kCUDA, 1);
    ckpt::saveFile(path, *saved, nullptr, {});
    Net other;
    other->to(cuda1);
    ckpt::loadFile(path, *other, nullptr, cuda1);
    check(allOn(other, cuda1) && sameValues(other, saved), "a model saved from cuda:0 loads onto cuda:1");
  }

  // The generators: a checkpoint taken now, then draws; restoring it repeats the same draws.
  torch::manual_seed(7);
  ckpt::saveFile(path, *saved, nullptr, {});
  const auto first = torch::randn({64}, torch::TensorOptions().device(cuda0));
  (void)torch::randn({1000}, torch::TensorOptions().device(cuda0));  // move the generator on
  auto loaded = ckpt::loadFile(path, *back, nullptr, cuda0);
  check(loaded.cuda_rng_states.size() == 1 && loaded.cuda_rng_states[0].numel() > 0,
        "the checkpoint holds the CUDA generators' state beside the CPU one");
  check(ckpt::setCudaRngState(loaded.cuda_rng_states[0]), "the CUDA generators' state is restored");
  const auto again = torch::randn({64}, torch::TensorOptions().device(cuda0));
  check(torch::equal(first.cpu(), again.cpu()), "draws after restoring repeat the draws after saving");

  // Not remove_all: on the GPU machine's image (pip torch 2.11, g++ 13) it called through a null
  // pointer inside libstdc++ in this process, after every check had passed. The one file, then
  // the directory.
  std::filesystem::remove(path);
  std::filesystem::remove(dir);
  return 0;
}

}  // namespace

int main() {
  // Unbuffered: a crash must not swallow the checks that passed before it (the first GPU run
  // crashed with nothing printed, so it is unknown how far it got).
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  return ddprun::runtime::recordErrors([] { return run(); });
}
