// Helper process for the checkpoint atomicity tests: writes checkpoints and is killed
// while doing so. Reports by output and exit status only.
//
//   checkpoint_test_writer once PATH VALUE [FSIZE_LIMIT]  one save of a model filled with VALUE;
//                                                        with FSIZE_LIMIT (bytes), RLIMIT_FSIZE
//                                                        makes the kernel kill it mid-write (SIGXFSZ)
//   checkpoint_test_writer loop PATH FIRST                saves FIRST, FIRST+1, ... until killed,
//                                                        printing "saved N" after each
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/env_reader.h"
#include "tests/trainers/checkpoint_test_model.h"
#include "worker_runtime/checkpoint/checkpoint.h"

namespace ckpt = ddprun::checkpoint;

int main(int argc, char** argv) {
  try {
    if (argc < 4) {
      std::fprintf(stderr, "usage: checkpoint_test_writer once|loop PATH VALUE [FSIZE_LIMIT]\n");
      return 2;
    }
    const std::string mode = argv[1];
    const std::string path = argv[2];
    const auto first = static_cast<int>(ddprun::env::parseInteger("first", argv[3], INT32_MIN, INT32_MAX));
    ddprun::testing::CheckpointTestNet model;
    if (mode == "once") {
      ddprun::testing::fillModel(*model, static_cast<float>(first));
      if (argc == 5) {
        const auto limit = static_cast<rlim_t>(ddprun::env::parseInteger("limit", argv[4], 0, INT64_MAX));
        struct rlimit rl {
          limit, limit
        };
        // SIGXFSZ dumps core by default: no core file in the test's directory.
        struct rlimit no_core {
          0, 0
        };
        if (setrlimit(RLIMIT_CORE, &no_core) != 0 || setrlimit(RLIMIT_FSIZE, &rl) != 0) return 3;
      }
      ckpt::saveFile(path, *model, nullptr, {.step = first});
      std::printf("saved %d\n", first);
      return 0;
    }
    if (mode == "loop") {
      for (int value = first;; ++value) {
        ddprun::testing::fillModel(*model, static_cast<float>(value));
        ckpt::saveFile(path, *model, nullptr, {.step = value});
        std::printf("saved %d\n", value);
        std::fflush(stdout);
      }
    }
    std::fprintf(stderr, "checkpoint_test_writer: unknown mode %s\n", mode.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_test_writer: %s\n", e.what());
    return 1;
  }
}
