// The seed and time budget of a fuzz loop: a new seed each run, printed so that a failure
// can be replayed (DDPRUN_FUZZ_SEED=<seed>); DDPRUN_FUZZ_SECONDS bounds the run (default 20).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace ddprun::testing {

struct FuzzRun {
  uint32_t seed = 0;
  std::chrono::milliseconds budget{20000};
};

inline FuzzRun fuzzRun(const char* what) {
  FuzzRun run;
  const char* seed_env = std::getenv("DDPRUN_FUZZ_SEED");
  run.seed = seed_env ? static_cast<uint32_t>(std::stoul(seed_env)) : std::random_device{}();
  if (const char* seconds = std::getenv("DDPRUN_FUZZ_SECONDS")) {
    run.budget = std::chrono::milliseconds(static_cast<int64_t>(1000 * std::stod(seconds)));
  }
  std::printf("%s fuzz: seed %u (replay with DDPRUN_FUZZ_SEED=%u), %lld ms\n", what, run.seed, run.seed,
              static_cast<long long>(run.budget.count()));
  std::fflush(stdout);
  return run;
}

}  // namespace ddprun::testing
