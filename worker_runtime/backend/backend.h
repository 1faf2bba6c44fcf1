// The seam between ddprun::dist's calls and what runs them, as in gloo and tensorpipe: one
// implementation per backend (host: TCP plus shared memory, CUDA tensors through pinned host
// copies; NCCL: CUDA tensors on the GPU). A process group holds one per device type its backend
// string names (backend_spec.h) and hands each call to the one of its tensors' device.
//
// Ranks here are group ranks, and the arguments were checked by the caller (list lengths,
// matching sizes and devices). With async_op the Work is returned once the op is issued;
// without, the call returns when the result is usable: on the host, done; on a device,
// ordered before whatever the caller's current stream runs next (torch's semantics).
#pragma once

#include <string_view>
#include <vector>

#include <ATen/ATen.h>

#include "worker_runtime/work.h"

namespace ddprun::dist {

using runtime::WorkPtr;

enum class ReduceOp { SUM, PRODUCT, MIN, MAX, AVG };

// One operation of a batch_isend_irecv, peer as a group rank.
struct P2PItem {
  bool send = true;  // false: receive into `tensor`
  at::Tensor tensor;
  int peer = 0;
  int tag = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // As torch's get_backend() names it: "gloo" or "nccl".
  virtual std::string_view name() const = 0;

  virtual WorkPtr broadcast(at::Tensor& tensor, int root, bool async_op) = 0;
  virtual WorkPtr allReduce(at::Tensor& tensor, ReduceOp op, bool async_op) = 0;
  virtual WorkPtr reduce(at::Tensor& tensor, int root, ReduceOp op, bool async_op) = 0;
  virtual WorkPtr allGather(std::vector<at::Tensor>& outputs, const at::Tensor& input, bool async_op) = 0;
  // `outputs` only on the root (nullptr elsewhere).
  virtual WorkPtr gather(const at::Tensor& input, std::vector<at::Tensor>* outputs, int root, bool async_op) = 0;
  // `inputs` only on the root (nullptr elsewhere).
  virtual WorkPtr scatter(at::Tensor& output, const std::vector<at::Tensor>* inputs, int root, bool async_op) = 0;
  virtual WorkPtr reduceScatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, ReduceOp op,
                                bool async_op) = 0;
  // Blocks may differ in size, pair by pair, as in torch.
  virtual WorkPtr allToAll(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs, bool async_op) = 0;
  virtual WorkPtr barrier(bool async_op) = 0;
  // Point to point: always asynchronous (the caller waits for a blocking send/recv).
  virtual WorkPtr send(const at::Tensor& tensor, int peer, int tag) = 0;
  virtual WorkPtr recv(at::Tensor& tensor, int peer, int tag) = 0;
  // Every item at once, one Work each (torch's batch_isend_irecv). The default posts them one
  // by one, which is enough where posted messages proceed independently (the host backend);
  // NCCL overrides it with one group of sends and receives, so no order of the items can
  // deadlock on its one stream.
  virtual std::vector<WorkPtr> batchP2P(std::vector<P2PItem>& items) {
    std::vector<WorkPtr> works;
    for (auto& item : items) {
      works.push_back(item.send ? send(item.tensor, item.peer, item.tag) : recv(item.tensor, item.peer, item.tag));
    }
    return works;
  }
};

}  // namespace ddprun::dist
