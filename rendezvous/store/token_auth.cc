#include "rendezvous/store/token_auth.h"

#include <cstdlib>
#include <fstream>

#include "common/challenge_response.h"
#include "common/env_names.h"
#include "common/error.h"
#include "rendezvous/store/wire_protocol.h"

namespace ddprun::rendezvous {
namespace {

const ChallengeResponse& storeChallenge() {
  static const ChallengeResponse challenge{"ddprun-server", "ddprun-client"};
  return challenge;
}

}  // namespace

std::string randomNonce() { return ddprun::randomNonce(wire::kAuthNonceBytes); }

std::string serverProof(const std::string& token, const std::string& client_nonce, const std::string& server_nonce) {
  return storeChallenge().serverProof(token, client_nonce, server_nonce);
}

std::string clientProof(const std::string& token, const std::string& client_nonce, const std::string& server_nonce) {
  return storeChallenge().clientProof(token, client_nonce, server_nonce);
}

std::string loadToken(const std::string& token_file) {
  if (const char* env = std::getenv(env::kToken); env && *env) return env;
  if (token_file.empty()) return "";
  std::ifstream in(token_file);
  if (!in) throw UsageError("--rdzv_conf token_file=" + token_file + ": cannot read the file");
  std::string token;
  std::getline(in, token);
  if (token.empty()) throw UsageError("--rdzv_conf token_file=" + token_file + ": the file is empty");
  return token;
}

}  // namespace ddprun::rendezvous
