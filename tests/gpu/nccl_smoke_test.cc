// The NCCL backend on one GPU (world size 1: NCCL refuses two ranks on one device), with
// a store served in this process: every operation runs and its result is checked on the
// host. Then the barrier across every GPU here, one rank per GPU as threads: each rank
// records its arrival before the barrier and must see every rank's after it, with the last
// rank arriving late, so a barrier that lets ranks through early fails (with one GPU, this
// checks only that the barrier completes). Runs only where a GPU is present (ctest label
// gpu). Prints one line per check and "N passed, N failed".
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/store_server.h"
#include "rendezvous/tcp_store_client.h"
#include "worker_runtime/backend/nccl_backend.h"

using namespace ddprun;

namespace {

// One rank per visible GPU (at most 8), as threads of this process, each with its own store
// client and communicator. Returns each rank's verdict: "" when it saw every rank arrive
// before it left the barrier, else what went wrong.
std::vector<std::string> barrierOnEveryGpu(int port, int world) {
  std::unique_ptr<std::atomic<bool>[]> arrived(new std::atomic<bool>[world]);
  for (int r = 0; r < world; ++r) arrived[r] = false;
  std::vector<std::string> verdicts(world);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        rendezvous::StoreClientOptions options;
        options.port = port;
        rendezvous::TcpStoreClient store(options);
        runtime::NcclBackend nccl(store, "smoke/barrier/", rank, world, rank, std::chrono::seconds(60));
        nccl.barrier();  // every communicator is up before the timed part
        // The last rank comes late: the others must still be inside the barrier when it arrives.
        if (rank == world - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        arrived[rank] = true;
        nccl.barrier();
        for (int q = 0; q < world; ++q) {
          if (!arrived[q]) verdicts[rank] += "rank " + std::to_string(q) + " had not arrived; ";
        }
      } catch (const std::exception& e) {
        verdicts[rank] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  return verdicts;
}

}  // namespace

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
  cudaFree(a);
  cudaFree(b);

  int devices = 0;
  cudaGetDeviceCount(&devices);
  const int world = std::min(devices, 8);
  const auto verdicts = barrierOnEveryGpu(server.port(), world);
  for (int rank = 0; rank < world; ++rank) {
    const bool ok = verdicts[rank].empty();
    std::printf("%s barrier: rank %d of %d saw every rank arrive before it left%s%s\n", ok ? "ok:" : "FAILED:", rank,
                world, ok ? "" : ": ", verdicts[rank].c_str());
    (ok ? passed : failed)++;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
