#include "worker_runtime/rpc/rpc_environment.h"

#include <fmt/format.h>

#include <charconv>
#include <climits>
#include <string_view>

#include "common/env_names.h"
#include "common/env_reader.h"
#include "common/error.h"

namespace ddprun::rpc::detail {

RpcEnvironment RpcEnvironment::fromEnvironment(const std::string& store_host, int store_port) {
  RpcEnvironment out;
  out.store_host = store_host;
  out.store_port = store_port;
  if (out.store_host.empty()) {
    auto addr = env::optionalString(env::kMasterAddr);
    if (!addr || !env::optionalString(env::kMasterPort)) {
      throw DdprunError("init_rpc: MASTER_ADDR and MASTER_PORT must be set (start with ddprun)");
    }
    out.store_host = std::move(*addr);
    // Checked as a port: atoi made "abc" port 0 and wrapped 70000 to 4464, a store elsewhere.
    out.store_port = env::requireInteger<int>(env::kMasterPort, 1, 65535);
  }
  // A malformed round fails here, as in init_process_group, instead of becoming part of the keys.
  out.restart_count = env::integerOr<int>(env::kRestartCount, 0, 0, INT_MAX);
  return out;
}

std::string PeerAddress::entry() const { return fmt::format("{}\n{}\n{}", name, host, port); }

PeerAddress PeerAddress::parse(int rank, const std::string& entry) {
  const auto a = entry.find('\n'), b = entry.rfind('\n');
  if (a == std::string::npos || a == b) {
    throw DdprunError("init_rpc: malformed address entry for rank " + std::to_string(rank));
  }
  // The whole rest is the port, 1 to 65535: a port that wrapped around would connect elsewhere.
  const std::string_view digits = std::string_view(entry).substr(b + 1);
  int port = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (ec != std::errc() || end != digits.data() + digits.size() || port < 1 || port > 65535) {
    throw DdprunError(fmt::format("init_rpc: malformed address entry for rank {} (port '{}')", rank, digits));
  }
  return {entry.substr(0, a), entry.substr(a + 1, b - a - 1), port};
}

}  // namespace ddprun::rpc::detail
