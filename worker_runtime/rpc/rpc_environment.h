// What an RPC worker reads to find its peers: the store it meets them through (from
// RpcBackendOptions, else MASTER_ADDR and MASTER_PORT, as ddprun and torchrun set them),
// the restart round that keeps one round's keys apart from the next's
// (TORCHELASTIC_RESTART_COUNT), and the address entry each worker publishes in that store
// ("<name>\n<host>\n<port>").
//
// Thread-safety: the functions keep no state; fromEnvironment() reads the process
// environment (safe as long as nobody calls setenv meanwhile). No LibTorch here, so the
// parsing is tested without it.
#pragma once

#include <string>

namespace ddprun::rpc::detail {

struct RpcEnvironment {
  std::string store_host;
  int store_port = 0;
  // The round's store keys start with "ddprun/rpc/<restart_count>/"; 0 when unset.
  int restart_count = 0;

  // The store given (RpcBackendOptions::store_host and store_port) when it names a host,
  // else MASTER_ADDR and MASTER_PORT. Throws DdprunError when neither names one, and
  // UsageError naming the variable and its value when MASTER_PORT is not a port (1..65535)
  // or TORCHELASTIC_RESTART_COUNT is not a count (0 or more).
  static RpcEnvironment fromEnvironment(const std::string& store_host, int store_port);
};

// A worker's address as it publishes it in the store.
struct PeerAddress {
  std::string name;
  std::string host;
  int port = 0;

  // The store entry: "<name>\n<host>\n<port>".
  std::string entry() const;
  // Parses rank `rank`'s entry. Throws DdprunError ("init_rpc: malformed address entry for
  // rank N...") when it has no name and host, or its port is not a number in 1..65535.
  static PeerAddress parse(int rank, const std::string& entry);
};

}  // namespace ddprun::rpc::detail
