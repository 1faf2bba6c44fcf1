// A program on the runtime's core for spare_wait_test.cc: main prints RANK and DDPRUN_SPARE
// as it finds them before it calls anything of the runtime (so what it prints is what the
// runtime's wait before main left), then LOCAL_RANK as the env contract reads it.
#include <cstdio>
#include <cstdlib>

#include "worker_runtime/env_contract.h"

int main() {
  const char* rank = std::getenv("RANK");
  const char* spare = std::getenv("DDPRUN_SPARE");
  std::printf("main RANK=%s DDPRUN_SPARE=%s\n", rank ? rank : "(unset)", spare ? spare : "(unset)");
  std::printf("device %d\n", ddprun::runtime::localDeviceIndex(8));
  return 0;
}
