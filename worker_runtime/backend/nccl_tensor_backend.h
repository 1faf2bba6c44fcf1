// The NCCL backend on CUDA tensors. Its implementation (nccl_tensor_backend_impl.h: the ops in
// nccl_ops.cc, the communicators in nccl_comms.cc, the watchdog in nccl_watchdog.cc) is built
// only against a CUDA-enabled LibTorch; elsewhere nccl_unavailable.cc says why it is not
// viable, so this header needs no CUDA.
//
// Semantics are torch's ProcessGroupNCCL's: an op runs on the group's communication stream,
// ordered after the caller's current stream by an event; wait() makes the caller's current
// stream wait for it without blocking the host (barrier() blocks the host, as torch's does);
// the caching allocator is told the tensors are in use on the communication stream. The
// communicator is made on the first CUDA op, on that op's device (one device per process), its
// id passed through the store; or split from the parent group's with ncclCommSplit.
//
// The watchdog: a thread per communicator polls its ops. One that has not completed within
// the group's timeout, or an asynchronous NCCL error (a peer died), aborts the communicator and
// fails every pending op with PeerError naming the ranks that are behind (each rank publishes
// how far it got in the store). Then, as torch's default TORCH_NCCL_ASYNC_ERROR_HANDLING=3
// does, the process ends (the message in its error file); with 0 or 2 it goes on and every
// later op on the group throws the same error.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "rendezvous/store/store.h"
#include "worker_runtime/backend/backend.h"

namespace ddprun::dist {

// Who a group's communicator is made for.
struct NcclGroup {
  std::shared_ptr<rendezvous::Store> store;
  std::string prefix;  // the group's store prefix
  int rank = 0;        // in the group
  int size = 1;
  std::chrono::milliseconds timeout{};
};

// Whether NCCL can run here; when not, `why` says why (this runtime was built without CUDA,
// or no CUDA device is visible).
bool ncclViable(std::string* why);

// A backend whose communicator is made on its first op. Throws DdprunError where not viable.
std::unique_ptr<Backend> makeNcclBackend(const NcclGroup& group);

// For new_group: every rank of `parent`'s group calls it, in the same order. When the parent
// has a communicator and this NCCL can split, the new group's is split from it now (ranks
// outside the group take part and get nullptr); otherwise the new group's communicator is made
// on its first op, as makeNcclBackend's. `parent` may be null (no NCCL in the parent group).
std::unique_ptr<Backend> splitNcclBackend(Backend* parent, const NcclGroup& group, bool member);

}  // namespace ddprun::dist
