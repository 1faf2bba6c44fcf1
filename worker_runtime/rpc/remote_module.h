// RemoteModule (torch.distributed.nn.RemoteModule): a module built on a named
// worker and called from anywhere. forward() is an RPC to the owner (recorded
// by distributed autograd when made inside a context); remote_parameters()
// returns RRefs to the owner's parameter tensors, for a DistributedOptimizer. A
// RemoteModule is an RRef to the module plus its kind, so it can be passed to
// other workers as Value(module.module_rref()) and rebuilt there with
// RemoteModule(rref).
//
// Built-in kinds: EmbeddingBag(num_embeddings, embedding_dim, mode
// "sum"|"mean"|"max") with forward(indices, offsets), and Linear(in_features,
// out_features, bias) with forward(x). Given a seed, parameters are initialized
// from a generator seeded with it exactly as reference_init() does, so a
// single-process reference can reproduce them.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "worker_runtime/rpc/rpc.h"

namespace ddprun::rpc {

class RemoteModule {
 public:
  // Builds an EmbeddingBag on `on`. Blocks until the owner has built it.
  static RemoteModule embedding_bag(const std::string& on, int64_t num_embeddings, int64_t embedding_dim,
                                    const std::string& mode = "sum", std::optional<uint64_t> seed = std::nullopt);
  static RemoteModule linear(const std::string& on, int64_t in_features, int64_t out_features, bool bias = true,
                             std::optional<uint64_t> seed = std::nullopt);
  // Wraps an RRef to a module made by one of the factories (e.g. received over
  // RPC).
  explicit RemoteModule(RRef module_rref) : rref_(std::move(module_rref)) {}

  // Runs forward on the owner; returns its output tensor. Throws as rpc_sync.
  at::Tensor forward(const Args& inputs) const;
  Future forward_async(const Args& inputs) const;
  // RRefs to the owner's parameters, in registration order (weight, then bias).
  std::vector<RRef> remote_parameters() const;

  const RRef& module_rref() const { return rref_; }
  WorkerInfo owner() const { return rref_.owner(); }

 private:
  RRef rref_;
};

// The parameter initialization RemoteModule uses with a seed, for local
// reference models: EmbeddingBag weight ~ N(0, 1); Linear weight and bias ~
// U(-1/sqrt(in), 1/sqrt(in)), in that order, from one CPU generator seeded with
// `seed`.
void reference_init(torch::nn::Module& module, uint64_t seed);

}  // namespace ddprun::rpc
