// The challenge-response both handshakes share (the store's token, RPC): the proofs are the
// HMACs the wire protocol documents (PROTOCOL.md), byte for byte, so a peer of an older
// ddprun still agrees; and a proof made with anything else (secret, label, nonces, their
// order) does not match.
#include "common/challenge_response.h"

#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "common/sha256.h"

using namespace ddprun;

namespace {

std::string bytesOf(const Sha256Digest& d) { return std::string(reinterpret_cast<const char*>(d.data()), d.size()); }

const std::string kClientNonce(16, '\x11');
const std::string kServerNonce = "sn-sixteen-bytes";

}  // namespace

TEST_CASE("challenge response: the server proves with label cn sn and the client with label sn cn", "[auth]") {
  const ChallengeResponse store{"ddprun-server", "ddprun-client"};
  CHECK(store.serverProof("token", kClientNonce, kServerNonce) ==
        bytesOf(hmacSha256("token", "ddprun-server" + kClientNonce + kServerNonce)));
  CHECK(store.clientProof("token", kClientNonce, kServerNonce) ==
        bytesOf(hmacSha256("token", "ddprun-client" + kServerNonce + kClientNonce)));
  const ChallengeResponse rpc{"ddprun-rpc-server|0|1|", "ddprun-rpc-client|0|1|"};
  CHECK(rpc.serverProof("secret", kClientNonce, kServerNonce) ==
        bytesOf(hmacSha256("secret", "ddprun-rpc-server|0|1|" + kClientNonce + kServerNonce)));
  CHECK(rpc.clientProof("secret", kClientNonce, kServerNonce).size() == 32);
}

TEST_CASE("challenge response: a proof matches only with the same secret, label, nonces and side", "[auth]") {
  const ChallengeResponse c{"server|", "client|"};
  const std::string proof = c.serverProof("secret", kClientNonce, kServerNonce);
  CHECK(proofMatches(proof, c.serverProof("secret", kClientNonce, kServerNonce)));
  CHECK_FALSE(proofMatches(proof, c.serverProof("Secret", kClientNonce, kServerNonce)));
  CHECK_FALSE(proofMatches(proof, c.serverProof("secret", kServerNonce, kClientNonce)));
  CHECK_FALSE(proofMatches(proof, c.serverProof("secret", kClientNonce, kClientNonce)));
  CHECK_FALSE(proofMatches(proof, c.clientProof("secret", kClientNonce, kServerNonce)));
  CHECK_FALSE(
      proofMatches(proof, ChallengeResponse{"other|", "client|"}.serverProof("secret", kClientNonce, kServerNonce)));
  CHECK_FALSE(proofMatches(proof, proof.substr(0, 31)));
}

TEST_CASE("challenge response: nonces have the length asked and do not repeat", "[auth]") {
  CHECK(randomNonce(0).empty());
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string n = randomNonce(16);
    CHECK(n.size() == 16);
    seen.insert(n);
  }
  CHECK(seen.size() == 100);
}
