// torch.distributed for C++ workers: the same calls, names and arguments as the Python
// module (snake_case on purpose, as torch.distributed spells them, so a PyTorch user finds
// their way at once), on LibTorch tensors: CPU ones over ddprun's host backend (TCP, shared
// memory), CUDA ones over NCCL or through pinned host copies on the host backend, as the
// group's backend string says (backend/backend_spec.h; torch's "cpu:gloo,cuda:nccl" form too).
//
//   ddprun::dist::init_process_group();                 // env:// from ddprun / torchrun
//   auto t = torch::ones({4});
//   ddprun::dist::all_reduce(t);                        // blocking
//   auto work = ddprun::dist::all_reduce(t, ReduceOp::SUM, {}, /*async_op=*/true);
//   work->wait();                                       // rethrows a peer's failure
//
// Every call that talks to peers has a deadline (the group's timeout, default 30 min like
// torch's) and fails with PeerError naming the peer instead of hanging. Non-contiguous
// tensors work (through a contiguous copy). Thread-safety: calls on one group may come
// from several threads; collectives run in the order they were issued.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "worker_runtime/backend/backend.h"
#include "worker_runtime/transport/links.h"
#include "worker_runtime/work.h"

namespace ddprun::dist {

using runtime::PeerError;
using runtime::Work;
using runtime::WorkPtr;

class ProcessGroup;
using Group = std::shared_ptr<ProcessGroup>;  // empty: the default group

struct InitOptions {
  // "auto" (NCCL for CUDA tensors where viable, else host copies; the host backend for CPU
  // ones), "gloo" or "cpu" (the host backend for both), "nccl" (CUDA tensors only), or per
  // device: "cpu:gloo,cuda:nccl". Asking for NCCL where it is not viable is a UsageError.
  std::string backend = "auto";
  std::string init_method = "env://";  // "env://", "tcp://host:port", "file:///path".
  int world_size = -1;                 // required for tcp:// and file://; env:// reads WORLD_SIZE.
  int rank = -1;                       // required for tcp:// and file://; env:// reads RANK.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
};

// Creates the default group. Blocks until every rank is connected or the timeout passes.
// Throws DdprunError (bad arguments, missing environment), PeerError, StoreError.
void init_process_group(const InitOptions& options = {});
void init_process_group(const std::string& backend, const std::string& init_method = "env://", int world_size = -1,
                        int rank = -1, std::chrono::milliseconds timeout = std::chrono::minutes(30));
bool is_initialized();
// Tears down every group (closing connections); collectives after it throw.
void destroy_process_group();

int get_rank(const Group& group = {});
int get_world_size(const Group& group = {});
// The global rank of `group_rank` in `group` (torch's get_global_rank); throws DdprunError
// when it is outside the group.
int get_global_rank(const Group& group, int group_rank);
// Every rank of the default group must call it with the same ranks; ranks outside
// `ranks` get an empty Group (like torch's GroupMember.NON_GROUP_MEMBER). `backend`: as
// init_process_group's; empty: the default group's. Its NCCL communicator is split from the
// default group's (ncclCommSplit) when that one exists, else made on its first CUDA op.
Group new_group(const std::vector<int>& ranks, std::chrono::milliseconds timeout = {}, const std::string& backend = "");
// The group's backend as torch's get_backend() names it: "gloo", "nccl" or
// "cpu:gloo,cuda:nccl" ("auto" settled: NCCL where it is viable).
std::string get_backend(const Group& group = {});
// Where the group's small control collectives can run (torch's _get_pg_default_device): the
// CPU where its backend serves CPU tensors, else this rank's current CUDA device.
at::Device get_default_device(const Group& group = {});

// Point to point. `tag` must match between the pair; messages between a pair are
// delivered in order. A peer that is this rank or outside the group throws DdprunError at
// once (as torch refuses it).
void send(const at::Tensor& tensor, int dst, const Group& group = {}, int tag = 0);
int recv(at::Tensor& tensor, int src, const Group& group = {}, int tag = 0);
WorkPtr isend(const at::Tensor& tensor, int dst, const Group& group = {}, int tag = 0);
WorkPtr irecv(at::Tensor& tensor, int src, const Group& group = {}, int tag = 0);

// torch's P2POp and batch_isend_irecv: the sends and receives of `ops` posted together, one
// Work each (on NCCL one group of sends and receives: any order of the list is safe). Every op
// must name the same group, and tensors of one device type. A peer that is this rank or outside
// the group throws DdprunError at once, before anything is posted.
struct P2POp {
  enum class Kind { kSend, kRecv };  // torch passes dist.isend / dist.irecv
  Kind op = Kind::kSend;
  at::Tensor tensor;
  int peer = 0;  // a global rank
  Group group = {};
  int tag = 0;
};
std::vector<WorkPtr> batch_isend_irecv(const std::vector<P2POp>& ops);

// Collectives. With async_op the Work is returned at once; otherwise the call blocks and
// returns the completed Work. Ranks (src/dst) are global ranks, as in torch.
WorkPtr broadcast(at::Tensor& tensor, int src, const Group& group = {}, bool async_op = false);
WorkPtr all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::SUM, const Group& group = {}, bool async_op = false);
WorkPtr reduce(at::Tensor& tensor, int dst, ReduceOp op = ReduceOp::SUM, const Group& group = {},
               bool async_op = false);
WorkPtr all_gather(std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor, const Group& group = {},
                   bool async_op = false);
// gather_list is used on dst only (pass nullptr elsewhere).
WorkPtr gather(const at::Tensor& tensor, std::vector<at::Tensor>* gather_list, int dst, const Group& group = {},
               bool async_op = false);
// scatter_list is used on src only (pass nullptr elsewhere).
WorkPtr scatter(at::Tensor& tensor, const std::vector<at::Tensor>* scatter_list, int src, const Group& group = {},
                bool async_op = false);
WorkPtr reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& input_list, ReduceOp op = ReduceOp::SUM,
                       const Group& group = {}, bool async_op = false);
WorkPtr all_to_all(std::vector<at::Tensor>& output_tensor_list, const std::vector<at::Tensor>& input_tensor_list,
                   const Group& group = {}, bool async_op = false);
WorkPtr barrier(const Group& group = {}, bool async_op = false);

}  // namespace ddprun::dist
