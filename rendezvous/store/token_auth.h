// The store's optional shared secret (ddprun's extension to torch's protocol).
// After VALIDATE a ddprun client sends AUTH_HELLO with a fresh client nonce; the server
// answers with its own nonce and proof = HMAC(token, "ddprun-server" | cn | sn); the
// client checks that proof (so a fake server cannot pose as the job's) and sends
// AUTH_PROOF = HMAC(token, "ddprun-client" | sn | cn); the server answers 1 (accepted)
// or closes. The token itself never crosses the wire. The proofs are common/
// challenge_response.h's, under the labels "ddprun-server" and "ddprun-client".
#pragma once

#include <string>

namespace ddprun::rendezvous {

std::string randomNonce();
std::string serverProof(const std::string& token, const std::string& client_nonce, const std::string& server_nonce);
std::string clientProof(const std::string& token, const std::string& client_nonce, const std::string& server_nonce);

// The token from DDPRUN_TOKEN, else from `token_file` (its first line), else empty.
// Throws UsageError when the file cannot be read or is empty.
std::string loadToken(const std::string& token_file);

}  // namespace ddprun::rendezvous
