// The RPC secret handed to a worker: a file only this user can read, named by
// DDPRUN_RPC_SECRET_FILE, so the secret stays out of environment dumps and `ps e` output.
#pragma once

#include <string>

namespace ddprun::agent {

// Writes `secret` to `path` with mode 0600 (replacing any file there). Throws SystemError.
void writeSecretFile(const std::string& path, const std::string& secret);

}  // namespace ddprun::agent
