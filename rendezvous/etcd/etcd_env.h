// The rendezvous on etcd (--rdzv_backend=etcd-v2, or etcd): DynamicRendezvous's rounds over
// an EtcdStore, its keep-alives on etcd leases (EtcdRoundLease), the workers' stores hosted
// over TCP as with c10d. openRendezvous() is the one place the agent picks a backend.
#pragma once

#include <memory>

#include "rendezvous/dynamic_rendezvous.h"
#include "rendezvous/etcd/etcd_http.h"
#include "rendezvous/rendezvous_env.h"

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

class EtcdEnv final : public RendezvousEnv {
 public:
  EtcdEnv(const RendezvousConfig& config);
  // An EtcdStore, after one status request that a member answered (within
  // min(connect_timeout, 10 s)); its calls time out after options.timeout. Host and port
  // in `options` are the TCP store's and are ignored.
  std::unique_ptr<StoreClient> connect(const StoreClientOptions& options) override;
  std::unique_ptr<HostedStore> host(const StoreServerOptions& options) override;
  Clock& clock() override;
  std::string nodeName() override;
  std::unique_ptr<RoundLiveness> liveness(const RoundLivenessSpec& spec) override;

 private:
  EtcdSettings settings_;
  std::chrono::milliseconds read_timeout_;
};

}  // namespace ddprun::rendezvous::etcd

namespace ddprun::rendezvous {
// The job's rendezvous for its --rdzv_backend: etcd's in an EtcdEnv, the others over TCP.
std::unique_ptr<DynamicRendezvous> openRendezvous(const RendezvousConfig& config, int nproc_per_node);
}  // namespace ddprun::rendezvous
