// The mutual challenge-response over a shared secret that both of ddprun's handshakes use:
// the store's token (rendezvous/store/token_auth.h; PROTOCOL.md, "Token") and the RPC workers'
// secret (worker_runtime/rpc/auth.h). Each side sends a fresh nonce; the server proves that
// it knows the secret with HMAC-SHA256(secret, server label | cn | sn), and the client with
// HMAC-SHA256(secret, client label | sn | cn). Each proof covers both nonces, so none can be
// replayed on another connection; the labels differ, so one side's proof never answers for
// the other, and they bind a proof to its protocol (and, for RPC, to the two ranks). The
// secret never crosses the wire.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ddprun {

struct ChallengeResponse {
  std::string server_label;  // what the server's proof starts with, before the nonces
  std::string client_label;  // the same for the client's

  // 32 bytes each: the HMACs above.
  std::string serverProof(std::string_view secret, std::string_view client_nonce, std::string_view server_nonce) const;
  std::string clientProof(std::string_view secret, std::string_view client_nonce, std::string_view server_nonce) const;
};

// `bytes` bytes from the system's randomness (std::random_device: /dev/urandom), for nonces.
std::string randomNonce(size_t bytes);

// Whether a proof received is the one expected, in time independent of where they differ.
bool proofMatches(std::string_view received, std::string_view expected);

}  // namespace ddprun
