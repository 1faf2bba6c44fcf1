// The NCCL backend: collectives on CUDA device buffers. Built only where CMake finds CUDA
// and NCCL (DDPRUN_HAVE_NCCL); the CPU build and its tests never need it. Debian's
// LibTorch is CPU-only, so this backend works on raw device pointers; a CUDA-enabled
// LibTorch would hand it tensor data pointers the same way.
//
// The NCCL unique id travels through the group's store. Communicators are created
// non-blocking, and every operation is waited for with a watchdog: a peer that dies or hangs
// makes the call fail with PeerError within the timeout (the communicator is aborted),
// never hang.
//
// Thread-safety: none. One thread issues every call of one backend, in the same order on
// every rank, as NCCL requires of a communicator; calls block that thread until done.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "rendezvous/store.h"
#include "worker_runtime/collectives/dtype.h"

namespace ddprun::runtime {

class NcclBackend {
 public:
  // True when a CUDA device is visible (the backend is viable here).
  static bool viable();

  // Collective over the group: rank 0 makes the NCCL id and publishes it under `prefix`.
  // Uses CUDA device `device`. Throws DdprunError / PeerError.
  NcclBackend(rendezvous::Store& store, const std::string& prefix, int rank, int size, int device,
              std::chrono::milliseconds timeout);
  ~NcclBackend();
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  // Same contracts as the host algorithms (algorithms.h), on device memory; each call
  // blocks until the GPU work is done.
  void allReduce(void* buf, size_t count, DType dtype, ReduceOp op);
  void broadcast(void* buf, size_t bytes, int root);
  void reduce(void* buf, size_t count, DType dtype, ReduceOp op, int root);
  void allGather(const void* in, void* out, size_t bytes_per_rank);
  void reduceScatter(const void* in, void* out, size_t count_per_rank, DType dtype, ReduceOp op);
  void allToAll(const void* in, void* out, size_t bytes_per_rank);
  void send(const void* buf, size_t bytes, int peer);
  void recv(void* buf, size_t bytes, int peer);
  void barrier();

 private:
  struct State;
  void complete(const char* what);

  std::unique_ptr<State> state_;
};

}  // namespace ddprun::runtime
