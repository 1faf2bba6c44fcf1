// Mutual authentication of RPC peers with the job's secret (torch's RPC has none).
//
// The caller opens the connection and sends ClientHello (its rank, the callee's rank it
// means to reach, a fresh nonce). The callee answers ServerHello with its own nonce and
// HMAC-SHA256(secret, "ddprun-rpc-server" | caller | callee | cn | sn), which the caller
// checks (a stranger cannot pose as a worker); the caller sends
// HMAC-SHA256(secret, "ddprun-rpc-client" | caller | callee | sn | cn) and the callee
// answers one byte, 1, or closes. The secret never crosses the wire; nothing but these
// fixed-size frames is read from a connection until it is authenticated. The proofs are
// common/challenge_response.h's, the store token's too, under labels of their own.
//
// The secret: DDPRUN_RPC_SECRET_FILE, a file (mode 0600) that ddprun writes for its
// workers each round (derived from the rendezvous token when there is one, random per
// round on a single node), or DDPRUN_RPC_SECRET. Without either (a multi-node job without
// a token, or workers started by another launcher) rank 0 makes one and shares it through
// the job's store, which is then as private as the store is.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace ddprun::rpc::auth {

inline constexpr uint32_t kHelloMagic = 0x48505244;  // "DRPH"
inline constexpr size_t kNonceBytes = 16;
inline constexpr size_t kProofBytes = 32;
inline constexpr uint8_t kAccepted = 1;
// A connection that has not finished the handshake by then is closed.
inline constexpr std::chrono::seconds kHandshakeTimeout{10};
// Connections still in the handshake at once; a new one past this closes the oldest.
inline constexpr size_t kMaxUnauthenticated = 64;

struct ClientHello {
  uint32_t magic = kHelloMagic;
  int32_t src = -1;  // the caller's rank
  int32_t dst = -1;  // the rank it means to reach
  uint32_t reserved = 0;
  uint8_t nonce[kNonceBytes] = {};
};
static_assert(sizeof(ClientHello) == 32);

struct ServerHello {
  uint32_t magic = kHelloMagic;
  int32_t src = -1;  // the callee's rank
  uint8_t nonce[kNonceBytes] = {};
  uint8_t proof[kProofBytes] = {};
};
static_assert(sizeof(ServerHello) == 56);

struct ClientProof {
  uint8_t proof[kProofBytes] = {};
};

std::string randomNonce();
// 64 hex digits of fresh randomness: a secret for one round.
std::string randomSecret();
std::string serverProof(const std::string& secret, int caller, int callee, const std::string& client_nonce,
                        const std::string& server_nonce);
std::string clientProof(const std::string& secret, int caller, int callee, const std::string& client_nonce,
                        const std::string& server_nonce);
bool proofsEqual(const std::string& a, const std::string& b);

// The secret the launcher handed over (DDPRUN_RPC_SECRET_FILE, else DDPRUN_RPC_SECRET),
// or nullopt when it handed none. Throws DdprunError naming the file when it cannot be
// read, is empty, or can be read by other users.
std::optional<std::string> secretFromEnvironment();

// The caller's side on a connected non-blocking socket: throws PeerError (refused,
// wrong proof, closed) or RpcTimeout past `deadline`. `who` names the callee in errors.
void clientHandshake(int fd, const std::string& secret, int caller, int callee,
                     std::chrono::steady_clock::time_point deadline, const std::string& who);

}  // namespace ddprun::rpc::auth
