#include "rendezvous/token_auth.h"

#include <cstdlib>
#include <fstream>
#include <random>

#include "common/env_names.h"
#include "common/error.h"
#include "rendezvous/sha256.h"
#include "rendezvous/wire_protocol.h"

namespace ddprun::rendezvous {
namespace {

std::string mac(const std::string& token, const std::string& label, const std::string& a, const std::string& b) {
  Sha256Digest d = hmacSha256(token, label + a + b);
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

}  // namespace

std::string randomNonce() {
  std::random_device device;
  std::string nonce(wire::kAuthNonceBytes, '\0');
  for (auto& c : nonce) c = static_cast<char>(device() & 0xff);
  return nonce;
}

std::string serverProof(const std::string& token, const std::string& client_nonce, const std::string& server_nonce) {
  return mac(token, "ddprun-server", client_nonce, server_nonce);
}

std::string clientProof(const std::string& token, const std::string& client_nonce, const std::string& server_nonce) {
  return mac(token, "ddprun-client", server_nonce, client_nonce);
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
