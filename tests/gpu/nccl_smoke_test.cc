// The NCCL backend on one GPU (world size 1: NCCL refuses two ranks on one device), with
// a store served in this process: every operation runs and its result is checked on the
// host. Runs only where a GPU is present (ctest label gpu). Prints one line per check and
// "N passed, N failed".
#include <cuda_runtime_api.h>

#include <cstdio>
#include <vector>

#include "rendezvous/store_server.h"
#include "rendezvous/tcp_store_client.h"
#include "worker_runtime/backend/nccl_backend.h"

using namespace ddprun;

int main() {
  if (!runtime::NcclBackend::viable()) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  rendezvous::StoreServerOptions server_options;
  server_options.host = "127.0.0.1";
  rendezvous::StoreServer server(server_options);
  rendezvous::StoreClientOptions client_options;
  client_options.port = server.port();
  rendezvous::TcpStoreClient store(client_options);
  runtime::NcclBackend nccl(store, "smoke/", 0, 1, 0, std::chrono::seconds(60));

  int passed = 0, failed = 0;
  const size_t n = 1 << 20;
  std::vector<float> host(n), back(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 1000);
  void* a = nullptr;
  void* b = nullptr;
  cudaMalloc(&a, n * sizeof(float));
  cudaMalloc(&b, n * sizeof(float));
  auto expectEqual = [&](const char* what, void* device) {
    cudaMemcpy(back.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost);
    bool ok = back == host;
    std::printf("%s %s\n", ok ? "ok:" : "FAILED:", what);
    (ok ? passed : failed)++;
  };
  cudaMemcpy(a, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  nccl.allReduce(a, n, runtime::DType::kFloat32, runtime::ReduceOp::kSum);
  expectEqual("all_reduce sum (world size 1 keeps the values)", a);
  nccl.allReduce(a, n, runtime::DType::kFloat32, runtime::ReduceOp::kAvg);
  expectEqual("all_reduce avg", a);
  nccl.broadcast(a, n * sizeof(float), 0);
  expectEqual("broadcast", a);
  nccl.reduce(a, n, runtime::DType::kFloat32, runtime::ReduceOp::kMax, 0);
  expectEqual("reduce max", a);
  nccl.allGather(a, b, n * sizeof(float));
  expectEqual("all_gather", b);
  nccl.reduceScatter(a, b, n, runtime::DType::kFloat32, runtime::ReduceOp::kSum);
  expectEqual("reduce_scatter", b);
  nccl.allToAll(a, b, n * sizeof(float));
  expectEqual("all_to_all", b);
  nccl.barrier();
  std::printf("ok: barrier\n");
  ++passed;
  cudaFree(a);
  cudaFree(b);
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
