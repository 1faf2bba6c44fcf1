// Built with `pkg-config --cflags --libs ddprun-runtime` alone (no LibTorch, no CMake):
// reads the worker contract the installed ddprun hands each worker.
#include <cstdio>

#include "worker_runtime/env_contract.h"

int main() {
  auto env = ddprun::runtime::WorkerEnv::fromEnvironment();
  std::printf("pkgconfig rank=%d local_rank=%d world=%d\n", env.rank, env.local_rank, env.world_size);
  return 0;
}
