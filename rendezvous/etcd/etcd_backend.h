// The rendezvous on etcd (--rdzv_backend=etcd-v2, or etcd) as a backend (rendezvous/
// backend.h): the rounds' keys in an EtcdStore, their keep-alives on etcd leases
// (EtcdRoundLease); the workers' stores are hosted over TCP as with c10d.
#pragma once

#include <memory>

#include "rendezvous/etcd/etcd_http.h"
#include "rendezvous/rounds/backend.h"

namespace ddprun::rendezvous::etcd {

bool isEtcdBackend(const std::string& backend);

// --rdzv_endpoint and the --rdzv_conf keys torch's etcd backends take: protocol (http or
// https), cacert, cert, key, key_prefix (default /ddprun; must start with '/'). Throws
// UsageError naming the culprit.
struct EtcdSettings {
  EtcdConnectionOptions connection;
  std::string key_prefix = "/ddprun";
};
EtcdSettings parseEtcdSettings(const RendezvousConfig& config, const RendezvousSettings& settings);

class EtcdBackend final : public Backend {
 public:
  // Throws UsageError (parseEtcdSettings) or an error naming an unreadable TLS file.
  explicit EtcdBackend(const RendezvousConfig& config);
  // An EtcdStore, after one status request that a member answered within 10 s (whatever
  // options.connect_timeout says); its calls time out after options.timeout (at least 10 s).
  std::unique_ptr<StoreClient> connect(StoreClientOptions options) override;
  // "etcd a:2379,b:2379"
  std::string storeText() const override { return "etcd " + endpoint_; }
  bool hostsStore() const override { return false; }
  bool outlivesJob() const override { return true; }
  std::unique_ptr<RoundLiveness> liveness(const std::function<RoundLivenessSpec()>& spec) override;

 private:
  EtcdSettings settings_;
  std::string endpoint_;
  std::chrono::milliseconds read_timeout_;
};

}  // namespace ddprun::rendezvous::etcd
