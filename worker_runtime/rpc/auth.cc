#include "worker_runtime/rpc/auth.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "common/env_names.h"
#include "rendezvous/sha256.h"
#include "worker_runtime/rpc/rpc.h"

namespace ddprun::rpc::auth {
namespace {

using Clock = std::chrono::steady_clock;

std::string mac(const std::string& secret, const char* label, int caller, int callee, const std::string& first,
                const std::string& second) {
  const std::string message = fmt::format("{}|{}|{}|", label, caller, callee) + first + second;
  const auto d = rendezvous::hmacSha256(secret, message);
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

// Waits for `events` on fd until the deadline; throws RpcTimeout after it.
void waitFor(int fd, short events, Clock::time_point deadline, const std::string& who) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) throw RpcTimeout(fmt::format("rpc: authenticating with {} timed out", who));
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (rc > 0 || (rc < 0 && errno != EINTR)) return;
  }
}

void sendAll(int fd, const void* data, size_t size, Clock::time_point deadline, const std::string& who) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      waitFor(fd, POLLOUT, deadline, who);
    } else {
      throw PeerError(fmt::format("rpc: authenticating with {}: {}", who, std::strerror(errno)));
    }
  }
}

void recvAll(int fd, void* data, size_t size, Clock::time_point deadline, const std::string& who) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::recv(fd, p, size, 0);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
    } else if (n == 0) {
      throw PeerError(fmt::format("rpc: {} refused the connection (a different job secret?)", who));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      waitFor(fd, POLLIN, deadline, who);
    } else {
      throw PeerError(fmt::format("rpc: authenticating with {}: {}", who, std::strerror(errno)));
    }
  }
}

std::string bytes(const uint8_t* p, size_t n) { return std::string(reinterpret_cast<const char*>(p), n); }

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

std::string randomNonce() {
  std::random_device device;  // /dev/urandom on Linux
  std::string nonce(kNonceBytes, '\0');
  for (auto& c : nonce) c = static_cast<char>(device() & 0xff);
  return nonce;
}

std::string randomSecret() {
  std::random_device device;
  std::string secret;
  for (int i = 0; i < 8; ++i) secret += fmt::format("{:08x}", device());
  return secret;
}

std::string serverProof(const std::string& secret, int caller, int callee, const std::string& client_nonce,
                        const std::string& server_nonce) {
  return mac(secret, "ddprun-rpc-server", caller, callee, client_nonce, server_nonce);
}

std::string clientProof(const std::string& secret, int caller, int callee, const std::string& client_nonce,
                        const std::string& server_nonce) {
  return mac(secret, "ddprun-rpc-client", caller, callee, server_nonce, client_nonce);
}

bool proofsEqual(const std::string& a, const std::string& b) { return rendezvous::constantTimeEqual(a, b); }

std::optional<std::string> secretFromEnvironment() {
  if (const char* path = std::getenv(env::kRpcSecretFile); path && *path) {
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
  if (const char* secret = std::getenv(env::kRpcSecret); secret && *secret) return trimmed(secret);
  return std::nullopt;
}

void clientHandshake(int fd, const std::string& secret, int caller, int callee, Clock::time_point deadline,
                     const std::string& who) {
  ClientHello hello;
  hello.src = caller;
  hello.dst = callee;
  const std::string cn = randomNonce();
  std::memcpy(hello.nonce, cn.data(), kNonceBytes);
  sendAll(fd, &hello, sizeof hello, deadline, who);
  ServerHello answer;
  recvAll(fd, &answer, sizeof answer, deadline, who);
  const std::string sn = bytes(answer.nonce, kNonceBytes);
  if (answer.magic != kHelloMagic || answer.src != callee ||
      !proofsEqual(bytes(answer.proof, kProofBytes), serverProof(secret, caller, callee, cn, sn))) {
    throw PeerError(fmt::format("rpc: {} did not prove it knows the job secret (another job on its port?)", who));
  }
  ClientProof proof;
  const std::string mine = clientProof(secret, caller, callee, cn, sn);
  std::memcpy(proof.proof, mine.data(), kProofBytes);
  sendAll(fd, &proof, sizeof proof, deadline, who);
  uint8_t verdict = 0;
  recvAll(fd, &verdict, 1, deadline, who);
  if (verdict != kAccepted) throw PeerError(fmt::format("rpc: {} refused this worker's proof", who));
}

}  // namespace ddprun::rpc::auth
