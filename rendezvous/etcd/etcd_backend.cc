#include "rendezvous/etcd/etcd_backend.h"

#include <fmt/format.h>

#include "common/error.h"
#include "rendezvous/etcd/etcd_round_lease.h"

namespace ddprun::rendezvous::etcd {
namespace {

using std::chrono::milliseconds;

// The longest an agent waits for some member to answer when it starts: an unreachable
// cluster is one clear error soon, not a join_timeout later.
constexpr milliseconds kReachTimeout{10000};

// The least time one etcd operation gets, whatever read_timeout says: enough to ride out the
// leader's loss (etcd's election timeout, 1 s by default, an election or two) after a silent
// member's attempt. With less, every agent re-forming at that moment failed at once and the
// job ended (the 30-minute etcd soak: the leader's link cut while a node rejoined).
constexpr milliseconds kOperationFloor{10000};

std::string conf(const RendezvousConfig& config, const char* key) {
  const auto it = config.conf.find(key);
  return it == config.conf.end() ? std::string() : it->second;
}

}  // namespace

bool isEtcdBackend(const std::string& backend) { return backend == "etcd-v2" || backend == "etcd"; }

EtcdSettings parseEtcdSettings(const RendezvousConfig& config, const RendezvousSettings& settings) {
  EtcdSettings s;
  if (config.endpoint.empty()) {
    throw UsageError("--rdzv_backend=" + config.backend +
                     " needs --rdzv_endpoint host:port[,host:port...] (etcd's members)");
  }
  s.connection.endpoints = parseEndpoints(config.endpoint);
  const std::string protocol = conf(config, "protocol");
  if (protocol == "https") {
    s.connection.tls = true;
  } else if (!protocol.empty() && protocol != "http") {
    throw UsageError("--rdzv_conf protocol=" + protocol + ": expected http or https");
  }
  s.connection.cacert = conf(config, "cacert");
  s.connection.cert = conf(config, "cert");
  s.connection.key = conf(config, "key");
  if (config.conf.count("key_prefix")) {
    s.key_prefix = conf(config, "key_prefix");
    if (s.key_prefix.empty() || s.key_prefix.front() != '/') {
      throw UsageError("--rdzv_conf key_prefix=" + s.key_prefix + ": expected an etcd key prefix starting with '/'");
    }
    while (s.key_prefix.size() > 1 && s.key_prefix.back() == '/') s.key_prefix.pop_back();
  }
  // One request to one member: a member that stays silent this long is left for the next.
  s.connection.attempt_timeout =
      std::clamp(std::min(settings.read_timeout, settings.keep_alive_interval), milliseconds(1000), milliseconds(5000));
  return s;
}

EtcdBackend::EtcdBackend(const RendezvousConfig& config) : endpoint_(config.endpoint) {
  const RendezvousSettings settings = parseRendezvousSettings(config.conf);
  settings_ = parseEtcdSettings(config, settings);
  read_timeout_ = settings.read_timeout;
  EtcdHttp check(settings_.connection);  // unreadable TLS files fail here, before any round
}

std::unique_ptr<StoreClient> EtcdBackend::connect(StoreClientOptions options) {
  auto store = std::make_unique<EtcdStore>(settings_.connection, settings_.key_prefix,
                                           std::max(options.timeout, kOperationFloor));
  // kReachTimeout whatever connect_timeout says: the round watcher connects mid-job with
  // read_timeout as its connect_timeout, and with 1 s a frozen leader's silent attempt used it
  // all, so every agent re-forming then lost the store at once (an etcd test, under load).
  static_assert(kReachTimeout >= kOperationFloor, "a connection gets at least one operation's time");
  store->probe(kReachTimeout);
  return store;
}

std::unique_ptr<RoundLiveness> EtcdBackend::liveness(const std::function<RoundLivenessSpec()>& spec) {
  auto store =
      std::make_unique<EtcdStore>(settings_.connection, settings_.key_prefix, std::max(read_timeout_, kOperationFloor));
  return std::make_unique<EtcdRoundLease>(std::move(store), spec());
}

}  // namespace ddprun::rendezvous::etcd
