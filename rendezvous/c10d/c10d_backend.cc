#include "rendezvous/c10d/c10d_backend.h"

#include <arpa/inet.h>

#include <string>

#include "common/error.h"
#include "common/logging.h"
#include "rendezvous/c10d/local_addresses.h"
#include "rendezvous/rounds/rendezvous_env.h"

namespace ddprun::rendezvous::c10d {
namespace {

constexpr int kStaticDefaultPort = 29500;
constexpr int kC10dDefaultPort = 29400;

bool isIpLiteral(const std::string& host) {
  in6_addr buf{};
  return ::inet_pton(AF_INET, host.c_str(), &buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), &buf) == 1;
}

class TcpBackend final : public Backend {
 public:
  TcpBackend(const BackendContext& context, bool fixed_seats) : env_(context.env) {
    const RendezvousConfig& config = context.config;
    const RendezvousSettings& settings = context.settings;
    auto log = logger("rendezvous");
    bool should_host = false;
    bool host_explicit = false;
    // Port 0 asked for: the host takes a port from the kernel and announces it (many jobs on
    // one machine never race for a port); the other nodes cannot guess it.
    bool announce_port = false;
    std::string bind_host = "0.0.0.0";
    if (!context.node) {
      // A reader (ddprun status) finds the store at the endpoint, whichever backend.
      splitHostPort(config.endpoint, host_, port_, kC10dDefaultPort);
      return;
    }
    if (config.standalone) {
      host_ = "127.0.0.1";
      port_ = 0;
      should_host = host_explicit = true;
      bind_host = host_;
    } else if (fixed_seats) {
      host_ = config.master_addr;
      port_ = config.master_port ? *config.master_port : (config.max_nodes == 1 ? 0 : kStaticDefaultPort);
      should_host = host_explicit = config.node_rank == 0;
      if (isIpLiteral(host_) && isLocalAddress(host_)) bind_host = host_;
      announce_port = config.master_port == 0;
      if (announce_port && !should_host) {
        throw UsageError(
            "--master_port 0 (a port from the kernel) is for node 0, the store's host; the other nodes "
            "take the port it announces");
      }
      fixed_seats_ = true;
    } else {
      splitHostPort(config.endpoint, host_, port_, kC10dDefaultPort);
      host_explicit = settings.is_host.has_value();
      // Only resolve the endpoint (getaddrinfo) when is_host does not already decide.
      should_host = settings.is_host ? *settings.is_host : isLocalAddress(host_);
      if (host_ == "localhost") bind_host = "127.0.0.1";
      if (isIpLiteral(host_) && isLocalAddress(host_)) bind_host = host_;
      announce_port = port_ == 0;
      if (announce_port && !should_host) {
        throw UsageError("--rdzv_endpoint " + config.endpoint +
                         ": port 0 (a port from the kernel) needs this node to host the store (--rdzv_conf "
                         "is_host=true); the other nodes take the port the host announces");
      }
    }
    if (!should_host) return;
    try {
      StoreServerOptions options;
      options.host = bind_host;
      options.port = port_;
      options.token = context.token;
      server_ = env_.host(options);
      port_ = server_->port();
      if (host_ == "0.0.0.0") host_ = "127.0.0.1";
      if (announce_port) {
        log->info("serving the rendezvous store on {}:{}, a port from the kernel: give it to the other nodes", host_,
                  port_);
      } else {
        log->debug("hosting the rendezvous store on {}:{}", bind_host, port_);
      }
    } catch (const SystemError& e) {
      // Another agent on this host already serves the endpoint: join it as a client.
      if (host_explicit || e.code() != EADDRINUSE)
        throw RendezvousError(std::string("cannot host the store: ") + e.what());
      log->debug("rendezvous store {}:{} is already served on this host; joining it", host_, port_);
    }
    // Static jobs without a token give the workers the rendezvous store itself, as torchrun
    // does (MASTER_PORT = --master_port).
    if (fixed_seats_ && context.token.empty() && server_) {
      shared_workers_store_ = config.master_addr + ":" + std::to_string(port_);
    }
  }

  std::unique_ptr<StoreClient> connect(StoreClientOptions options) override {
    options.host = host_;
    options.port = port_;
    return env_.connect(options);
  }
  std::string storeText() const override { return host_ + ":" + std::to_string(port_); }
  bool hostsStore() const override { return server_ != nullptr; }
  bool outlivesJob() const override { return false; }
  bool fixedSeats() const override { return fixed_seats_; }
  std::optional<std::string> sharedWorkersStore() const override { return shared_workers_store_; }

 private:
  RendezvousEnv& env_;
  std::string host_;
  int port_ = 0;
  bool fixed_seats_ = false;
  std::optional<std::string> shared_workers_store_;
  std::unique_ptr<HostedStore> server_;
};

}  // namespace

std::unique_ptr<Backend> makeC10dBackend(const BackendContext& context) {
  return std::make_unique<TcpBackend>(context, false);
}
std::unique_ptr<Backend> makeStaticBackend(const BackendContext& context) {
  return std::make_unique<TcpBackend>(context, true);
}

}  // namespace ddprun::rendezvous::c10d
