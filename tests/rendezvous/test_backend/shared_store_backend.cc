#include "tests/rendezvous/test_backend/shared_store_backend.h"

#include <map>
#include <memory>
#include <mutex>

#include "rendezvous/backends.h"
#include "rendezvous/rounds/rendezvous_env.h"

namespace ddprun::rendezvous::testing {
namespace {

struct Stores {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<InMemoryStore>> by_name;
};

Stores& stores() {
  static Stores* s = new Stores();  // never destroyed: connections may outlive the test case
  return *s;
}

class SharedStoreBackend final : public Backend {
 public:
  explicit SharedStoreBackend(const BackendContext& context) : name_(context.config.endpoint) {
    Stores& s = stores();
    std::lock_guard lock(s.mutex);
    auto& store = s.by_name[name_];
    // The store's waits run on the nodes' clock (a manual one in tests).
    if (!store) store = std::make_unique<InMemoryStore>(context.env.clock());
    store_ = store.get();
  }

  std::unique_ptr<StoreClient> connect(StoreClientOptions options) override { return store_->connect(options.timeout); }
  std::string storeText() const override { return "shared " + name_; }
  bool hostsStore() const override { return false; }
  bool outlivesJob() const override { return true; }

 private:
  std::string name_;
  InMemoryStore* store_ = nullptr;
};

// Registered as the program starts: rendezvous/backends.cc names no such backend.
const BackendRegistration kRegistration{
    kSharedBackend, [](const BackendContext& context) { return std::make_unique<SharedStoreBackend>(context); }};

}  // namespace

InMemoryStore& sharedStore(const std::string& name) {
  Stores& s = stores();
  std::lock_guard lock(s.mutex);
  const auto it = s.by_name.find(name);
  if (it == s.by_name.end()) throw StoreError("no shared store '" + name + "'");
  return *it->second;
}

}  // namespace ddprun::rendezvous::testing
