#include "worker_runtime/rpc/auth.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <random>
#include <span>
#include <utility>

#include "common/challenge_response.h"
#include "common/env_names.h"
#include "common/env_reader.h"
#include "common/socket_io.h"
#include "worker_runtime/rpc/rpc.h"

namespace ddprun::rpc::auth {
namespace {

using Clock = std::chrono::steady_clock;

// The labels bind each proof to the pair of ranks: "ddprun-rpc-server|caller|callee|".
ChallengeResponse rpcChallenge(int caller, int callee) {
  return ChallengeResponse{fmt::format("ddprun-rpc-server|{}|{}|", caller, callee),
                           fmt::format("ddprun-rpc-client|{}|{}|", caller, callee)};
}

// A socket_io failure in the handshake's words. A peer that closes mid-handshake is taken
// for one that refused this worker's proof: that is what a worker of another job does.
[[noreturn]] void rethrowHandshake(const SocketError& e, const std::string& who) {
  if (e.timedOut()) throw RpcTimeout(fmt::format("rpc: authenticating with {} timed out", who));
  if (e.peerClosed()) throw PeerError(fmt::format("rpc: {} refused the connection (a different job secret?)", who));
  throw PeerError(fmt::format("rpc: authenticating with {}: {}", who, std::strerror(e.code())));
}

void sendFrame(int fd, const void* data, size_t size, Clock::time_point deadline, const std::string& who) {
  try {
    sendAll(fd, std::span(static_cast<const std::byte*>(data), size), deadline);
  } catch (const SocketError& e) {
    rethrowHandshake(e, who);
  }
}

void recvFrame(int fd, void* data, size_t size, Clock::time_point deadline, const std::string& who) {
  try {
    recvAll(fd, std::span(static_cast<std::byte*>(data), size), deadline);
  } catch (const SocketError& e) {
    rethrowHandshake(e, who);
  }
}

std::string bytes(const uint8_t* p, size_t n) { return std::string(reinterpret_cast<const char*>(p), n); }

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

std::string randomNonce() { return ddprun::randomNonce(kNonceBytes); }

std::string randomSecret() {
  std::random_device device;
  std::string secret;
  for (int i = 0; i < 8; ++i) secret += fmt::format("{:08x}", device());
  return secret;
}

std::string serverProof(const std::string& secret, int caller, int callee, const std::string& client_nonce,
                        const std::string& server_nonce) {
  return rpcChallenge(caller, callee).serverProof(secret, client_nonce, server_nonce);
}

std::string clientProof(const std::string& secret, int caller, int callee, const std::string& client_nonce,
                        const std::string& server_nonce) {
  return rpcChallenge(caller, callee).clientProof(secret, client_nonce, server_nonce);
}

bool proofsEqual(const std::string& a, const std::string& b) { return proofMatches(a, b); }

std::optional<std::string> secretFromEnvironment() {
  if (const auto file = env::optionalString(env::kRpcSecretFile)) {
    const char* path = file->c_str();
    struct stat st {};
    if (::stat(path, &st) != 0) {
      throw DdprunError(fmt::format("rpc: {}={}: {}", env::kRpcSecretFile, path, std::strerror(errno)));
    }
    if ((st.st_mode & 077) != 0) {
      throw DdprunError(fmt::format("rpc: {}={}: other users can read it (mode {:o}; it must be 0600)",
                                    env::kRpcSecretFile, path, st.st_mode & 0777));
    }
    std::ifstream in(path);
    std::string secret;
    std::getline(in, secret);
    secret = trimmed(secret);
    if (secret.empty()) throw DdprunError(fmt::format("rpc: {}={} is empty", env::kRpcSecretFile, path));
    return secret;
  }
  if (auto secret = env::optionalString(env::kRpcSecret)) return trimmed(std::move(*secret));
  return std::nullopt;
}

void clientHandshake(int fd, const std::string& secret, int caller, int callee, Clock::time_point deadline,
                     const std::string& who) {
  ClientHello hello;
  hello.src = caller;
  hello.dst = callee;
  const std::string cn = randomNonce();
  std::memcpy(hello.nonce, cn.data(), kNonceBytes);
  sendFrame(fd, &hello, sizeof hello, deadline, who);
  ServerHello answer;
  recvFrame(fd, &answer, sizeof answer, deadline, who);
  const std::string sn = bytes(answer.nonce, kNonceBytes);
  if (answer.magic != kHelloMagic || answer.src != callee ||
      !proofsEqual(bytes(answer.proof, kProofBytes), serverProof(secret, caller, callee, cn, sn))) {
    throw PeerError(fmt::format("rpc: {} did not prove it knows the job secret (another job on its port?)", who));
  }
  ClientProof proof;
  const std::string mine = clientProof(secret, caller, callee, cn, sn);
  std::memcpy(proof.proof, mine.data(), kProofBytes);
  sendFrame(fd, &proof, sizeof proof, deadline, who);
  uint8_t verdict = 0;
  recvFrame(fd, &verdict, 1, deadline, who);
  if (verdict != kAccepted) throw PeerError(fmt::format("rpc: {} refused this worker's proof", who));
}

}  // namespace ddprun::rpc::auth
