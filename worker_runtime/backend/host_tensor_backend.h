// The host backend on tensors ("gloo"): CPU tensors straight through the host algorithms
// (HostBackend: TCP, shared memory), and CUDA tensors the way gloo's CUDA path does it, through
// pinned host copies. A CUDA tensor is copied to the host on the caller's current stream when
// the op is issued (that copy waits for the work already queued on it) and back on the same
// stream when the op ends, so the result is ordered before what the caller queues next.
#pragma once

#include <memory>

#include "worker_runtime/backend/backend.h"
#include "worker_runtime/backend/host_backend.h"

namespace ddprun::dist {

class HostTensorBackend final : public Backend {
 public:
  explicit HostTensorBackend(std::unique_ptr<runtime::HostBackend> host) : host_(std::move(host)) {}

  std::string_view name() const override { return "gloo"; }
  runtime::HostBackend& host() { return *host_; }

  WorkPtr broadcast(at::Tensor& tensor, int root, bool async_op) override;
  WorkPtr allReduce(at::Tensor& tensor, ReduceOp op, bool async_op) override;
  WorkPtr reduce(at::Tensor& tensor, int root, ReduceOp op, bool async_op) override;
  WorkPtr allGather(std::vector<at::Tensor>& outputs, const at::Tensor& input, bool async_op) override;
  WorkPtr gather(const at::Tensor& input, std::vector<at::Tensor>* outputs, int root, bool async_op) override;
  WorkPtr scatter(at::Tensor& output, const std::vector<at::Tensor>* inputs, int root, bool async_op) override;
  WorkPtr reduceScatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, ReduceOp op, bool async_op) override;
  WorkPtr allToAll(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs, bool async_op) override;
  WorkPtr barrier(bool async_op) override;
  WorkPtr send(const at::Tensor& tensor, int peer, int tag) override;
  WorkPtr recv(at::Tensor& tensor, int peer, int tag) override;

 private:
  std::unique_ptr<runtime::HostBackend> host_;
};

}  // namespace ddprun::dist
