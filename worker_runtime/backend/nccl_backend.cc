#include "worker_runtime/backend/nccl_backend.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "common/error.h"
#include "worker_runtime/transport/links.h"

namespace ddprun::runtime {
namespace {

void checkCuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw DdprunError(fmt::format("{}: CUDA error: {}", what, cudaGetErrorString(err)));
}

ncclDataType_t ncclTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt8: return ncclUint8;
  }
  throw DdprunError("NCCL: unknown dtype");
}

ncclRedOp_t ncclOpOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProduct: return ncclProd;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kAvg: return ncclAvg;
  }
  throw DdprunError("NCCL: unknown reduce op");
}

}  // namespace

struct NcclBackend::State {
  int rank = 0;
  int size = 1;
  int device = 0;
  std::chrono::milliseconds timeout{};
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* token = nullptr;  // one device int for barrier()
  bool aborted = false;
};

bool NcclBackend::viable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

NcclBackend::NcclBackend(rendezvous::Store& store, const std::string& prefix, int rank, int size, int device,
                         std::chrono::milliseconds timeout)
    : state_(std::make_unique<State>()) {
  if (!viable()) throw DdprunError("backend nccl: no CUDA device is visible here");
  State& s = *state_;
  s.rank = rank;
  s.size = size;
  s.device = device;
  s.timeout = timeout;
  checkCuda(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId id;
  const std::string key = prefix + "nccl/unique_id";
  if (rank == 0) {
    if (ncclGetUniqueId(&id) != ncclSuccess) throw DdprunError("ncclGetUniqueId failed");
    store.set(key, std::string(reinterpret_cast<const char*>(&id), sizeof id));
  } else {
    std::string bytes = store.get(key);
    if (bytes.size() != sizeof id) throw DdprunError("NCCL unique id from the store has the wrong size");
    std::memcpy(&id, bytes.data(), sizeof id);
  }
  checkCuda(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  checkCuda(cudaMalloc(&s.token, sizeof(int)), "cudaMalloc");
  // Non-blocking: initialisation and every call can be watched, and aborted on a timeout.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t result = ncclCommInitRankConfig(&s.comm, size, id, rank, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    throw DdprunError(fmt::format("ncclCommInitRankConfig: {}", ncclGetErrorString(result)));
  }
  complete("NCCL communicator initialisation");
}

NcclBackend::~NcclBackend() {
  State& s = *state_;
  if (s.comm) {
    if (s.aborted) {
      ncclCommAbort(s.comm);
    } else {
      ncclCommDestroy(s.comm);
    }
  }
  if (s.token) cudaFree(s.token);
  if (s.stream) cudaStreamDestroy(s.stream);
}

// Waits for the communicator's pending work and the stream, checking NCCL's asynchronous
// error state; past the timeout the communicator is aborted and the call fails.
void NcclBackend::complete(const char* what) {
  State& s = *state_;
  if (s.aborted) throw PeerError(fmt::format("{}: the NCCL communicator was aborted earlier", what));
  const auto deadline = Clock::now() + s.timeout;
  for (;;) {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(s.comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      s.aborted = true;
      throw PeerError(
          fmt::format("{} (rank {} of {}): NCCL error: {}", what, s.rank, s.size, ncclGetErrorString(async)));
    }
    if (async == ncclSuccess) {
      cudaError_t status = cudaStreamQuery(s.stream);
      if (status == cudaSuccess) return;
      if (status != cudaErrorNotReady) checkCuda(status, what);
    }
    if (Clock::now() >= deadline) {
      s.aborted = true;
      throw PeerError(fmt::format("{} (rank {} of {}): timed out after {} ms; a peer is gone or hung", what, s.rank,
                                  s.size, s.timeout.count()));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

namespace {

void enqueued(ncclResult_t result, const char* what) {
  if (result != ncclSuccess && result != ncclInProgress) {
    throw DdprunError(fmt::format("{}: {}", what, ncclGetErrorString(result)));
  }
}

}  // namespace

void NcclBackend::allReduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  State& s = *state_;
  enqueued(ncclAllReduce(buf, buf, count, ncclTypeOf(dtype), ncclOpOf(op), s.comm, s.stream), "ncclAllReduce");
  complete("all_reduce");
}

void NcclBackend::broadcast(void* buf, size_t bytes, int root) {
  State& s = *state_;
  enqueued(ncclBroadcast(buf, buf, bytes, ncclUint8, root, s.comm, s.stream), "ncclBroadcast");
  complete("broadcast");
}

void NcclBackend::reduce(void* buf, size_t count, DType dtype, ReduceOp op, int root) {
  State& s = *state_;
  enqueued(ncclReduce(buf, buf, count, ncclTypeOf(dtype), ncclOpOf(op), root, s.comm, s.stream), "ncclReduce");
  complete("reduce");
}

void NcclBackend::allGather(const void* in, void* out, size_t bytes_per_rank) {
  State& s = *state_;
  enqueued(ncclAllGather(in, out, bytes_per_rank, ncclUint8, s.comm, s.stream), "ncclAllGather");
  complete("all_gather");
}

void NcclBackend::reduceScatter(const void* in, void* out, size_t count_per_rank, DType dtype, ReduceOp op) {
  State& s = *state_;
  enqueued(ncclReduceScatter(in, out, count_per_rank, ncclTypeOf(dtype), ncclOpOf(op), s.comm, s.stream),
           "ncclReduceScatter");
  complete("reduce_scatter");
}

void NcclBackend::allToAll(const void* in, void* out, size_t bytes_per_rank) {
  State& s = *state_;
  enqueued(ncclGroupStart(), "ncclGroupStart");
  for (int peer = 0; peer < s.size; ++peer) {
    enqueued(ncclSend(static_cast<const char*>(in) + peer * bytes_per_rank, bytes_per_rank, ncclUint8, peer, s.comm,
                      s.stream),
             "ncclSend");
    enqueued(
        ncclRecv(static_cast<char*>(out) + peer * bytes_per_rank, bytes_per_rank, ncclUint8, peer, s.comm, s.stream),
        "ncclRecv");
  }
  enqueued(ncclGroupEnd(), "ncclGroupEnd");
  complete("all_to_all");
}

void NcclBackend::send(const void* buf, size_t bytes, int peer) {
  State& s = *state_;
  enqueued(ncclSend(buf, bytes, ncclUint8, peer, s.comm, s.stream), "ncclSend");
  complete("send");
}

void NcclBackend::recv(void* buf, size_t bytes, int peer) {
  State& s = *state_;
  enqueued(ncclRecv(buf, bytes, ncclUint8, peer, s.comm, s.stream), "ncclRecv");
  complete("recv");
}

void NcclBackend::barrier() {
  State& s = *state_;
  enqueued(ncclAllReduce(s.token, s.token, 1, ncclInt32, ncclSum, s.comm, s.stream), "ncclAllReduce");
  complete("barrier");
}

}  // namespace ddprun::runtime
