// Distributed autograd (torch.distributed.autograd): a context, identified by
// an id unique in the job, records every tensor that requires grad and crosses
// an RPC made inside it: the sender keeps the tensor (with its graph) as a
// "send", the receiver turns it into a fresh leaf, a "recv". backward(ctx,
// {loss}) runs the local graph, then sends each recv's gradient back to the
// worker that sent the tensor, which continues backward from its send through
// its own graph, and so on until every path has reached its leaves.
//
// Gradients of parameters live in the context (get_gradients), not in .grad, on
// every worker, as torch's do. On the worker that calls backward the local part
// runs through the ordinary autograd engine, so module hooks fire as in
// loss.backward() (DDP's gradient reduction among them); the gradients are then
// moved into the context and each parameter's .grad is left as it was before.
//
//   {
//     dist_autograd::Context ctx;  // torch: with dist_autograd.context() as ctx
//     auto loss = f(rpc::rpc_sync("ps", "lookup", {ids}).toTensor());
//     dist_autograd::backward(ctx.id(), {loss});
//     optimizer.step(ctx.id());
//   }                              // released here and on every peer
//
// Thread-safety: a context belongs to the thread that opened it (it is that
// thread's current context); gradients are thread-safe to read. backward may
// run once per context.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace ddprun::rpc::dist_autograd {

// Opens a context and makes it this thread's current one; the destructor
// releases it here and on every worker it reached. Needs init_rpc.
class Context {
 public:
  Context();
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  int64_t id() const { return id_; }

 private:
  int64_t id_;
  int64_t previous_;
};

// The current context of this thread, or -1.
int64_t current_context_id();

// Runs distributed backward from `roots` (scalars: a gradient of 1 each).
// Blocks until every worker reached has finished its part. Throws DdprunError
// (unknown context, root without grad), and RpcError or PeerError from peers.
void backward(int64_t context_id, const std::vector<at::Tensor>& roots, bool retain_graph = false);

// Gradients accumulated in the context on this worker: (parameter, gradient)
// pairs.
std::vector<std::pair<at::Tensor, at::Tensor>> get_gradients(int64_t context_id);

}  // namespace ddprun::rpc::dist_autograd
