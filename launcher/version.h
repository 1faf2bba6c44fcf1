// What `ddprun --version` prints: the project version from CMake, the git revision the
// binary was built from (where the build knew one) and the store wire generations spoken.
#pragma once

#include <string>

namespace ddprun::launcher {

// Lines ending in '\n', e.g. "ddprun 0.1.0 (git 1a2b3c4)\n...".
std::string versionText();

}  // namespace ddprun::launcher
