#include "rendezvous/rounds/rendezvous_env.h"

#include <unistd.h>

#include <fmt/format.h>

namespace ddprun::rendezvous {
namespace {

class ServedStore final : public HostedStore {
 public:
  explicit ServedStore(const StoreServerOptions& options) : server_(options) {}
  int port() const override { return server_.port(); }

 private:
  StoreServer server_;
};

class TcpEnv final : public RendezvousEnv {
 public:
  std::unique_ptr<StoreClient> connect(const StoreClientOptions& options) override {
    return std::make_unique<TcpStoreClient>(options);
  }
  std::unique_ptr<HostedStore> host(const StoreServerOptions& options) override {
    return std::make_unique<ServedStore>(options);
  }
  Clock& clock() override { return Clock::real(); }
  std::string nodeName() override {
    char buf[256] = {};
    ::gethostname(buf, sizeof buf - 1);
    return fmt::format("{}:{}", buf, ::getpid());
  }
};

}  // namespace

RendezvousEnv& RendezvousEnv::real() {
  // Leaked on purpose, as Clock::real(): nothing to tear down, and usable until exit.
  static RendezvousEnv* env = new TcpEnv();
  return *env;
}

}  // namespace ddprun::rendezvous
