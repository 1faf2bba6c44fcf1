// DistributedOptimizer (torch.distributed.optim.DistributedOptimizer): one
// local optimizer per worker that owns some of the parameters, created there
// over RPC; step(ctx) makes every owner apply the gradients held in
// distributed-autograd context `ctx` to its parameters, all owners in parallel,
// and returns when all are done. Parameters owned by this worker (RRef(tensor))
// take the same path. Steps from different optimizers on one owner are
// serialized (torch's global lock), so several trainers may share parameters.
//
// Update rules are torch 1.13's SGD (momentum, dampening, nesterov,
// weight_decay), Adagrad (lr_decay, weight_decay, initial_accumulator_value,
// eps) and Adam (betas, eps, weight_decay, amsgrad). A parameter with no
// gradient in the context is left as is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker_runtime/rpc/rpc.h"

namespace ddprun::rpc {

struct OptimizerOptions {
  double lr = 0.01;
  double momentum = 0.0;                   // SGD
  double dampening = 0.0;                  // SGD
  bool nesterov = false;                   // SGD
  double weight_decay = 0.0;               // all
  double lr_decay = 0.0;                   // Adagrad
  double initial_accumulator_value = 0.0;  // Adagrad
  double eps = -1;                         // default per kind: Adagrad 1e-10, Adam 1e-8
  double beta1 = 0.9;                      // Adam
  double beta2 = 0.999;                    // Adam
  bool amsgrad = false;                    // Adam
};

class DistributedOptimizer {
 public:
  // kind: "sgd", "adagrad" or "adam". Creates the per-owner optimizers
  // (blocking RPCs). Throws DdprunError on an unknown kind or an RRef that is
  // not a tensor.
  DistributedOptimizer(const std::string& kind, const std::vector<RRef>& parameters, OptimizerOptions options);

  // Applies context `context_id`'s gradients on every owner. Blocks; throws
  // RpcError or PeerError.
  void step(int64_t context_id);

 private:
  std::vector<RRef> remote_optimizers_;
};

}  // namespace ddprun::rpc
