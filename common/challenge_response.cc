#include "common/challenge_response.h"

#include <random>

#include "common/sha256.h"

namespace ddprun {
namespace {

std::string mac(std::string_view secret, std::string_view label, std::string_view first, std::string_view second) {
  std::string message;
  message.reserve(label.size() + first.size() + second.size());
  message.append(label).append(first).append(second);
  const Sha256Digest d = hmacSha256(secret, message);
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

}  // namespace

std::string ChallengeResponse::serverProof(std::string_view secret, std::string_view client_nonce,
                                           std::string_view server_nonce) const {
  return mac(secret, server_label, client_nonce, server_nonce);
}

std::string ChallengeResponse::clientProof(std::string_view secret, std::string_view client_nonce,
                                           std::string_view server_nonce) const {
  return mac(secret, client_label, server_nonce, client_nonce);
}

std::string randomNonce(size_t bytes) {
  std::random_device device;
  std::string nonce(bytes, '\0');
  for (auto& c : nonce) c = static_cast<char>(device() & 0xff);
  return nonce;
}

bool proofMatches(std::string_view received, std::string_view expected) {
  return constantTimeEqual(received, expected);
}

}  // namespace ddprun
