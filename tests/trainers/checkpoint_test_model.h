// The model the checkpoint tests save and load, shared by the test binary and its writer
// helper: parameters (two layers, 1 MiB) and buffers (BatchNorm's running statistics), so
// both kinds are covered and a file is large enough for a write to be caught halfway.
#pragma once

#include <torch/torch.h>

namespace ddprun::testing {

struct CheckpointTestNetImpl : torch::nn::Module {
  explicit CheckpointTestNetImpl(int64_t width = 512)
      : fc1(register_module("fc1", torch::nn::Linear(width, width))),
        bn(register_module("bn", torch::nn::BatchNorm1d(width))),
        fc2(register_module("fc2", torch::nn::Linear(width, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(bn(fc1(x)))); }

  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d bn;
  torch::nn::Linear fc2;
};
TORCH_MODULE(CheckpointTestNet);

// Sets every parameter and floating buffer to `value`: a file written from such a model
// is recognisable after loading, and a torn mix of two versions would show.
inline void fillModel(torch::nn::Module& model, float value) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) p.fill_(value);
  for (auto& b : model.buffers()) {
    if (b.is_floating_point()) b.fill_(value);
  }
}

}  // namespace ddprun::testing
