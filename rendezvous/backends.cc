#include "rendezvous/backends.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "rendezvous/c10d/c10d_backend.h"
#include "rendezvous/etcd/etcd_backend.h"
#include "rendezvous/store/token_auth.h"

namespace ddprun::rendezvous {
namespace {

// The built-in backends, as torch's rendezvous registry has its own from the start.
struct Registry {
  std::mutex mutex;
  std::map<std::string, BackendMaker> makers{
      {"c10d", c10d::makeC10dBackend},
      {"static", c10d::makeStaticBackend},
      {"etcd-v2", [](const BackendContext& c) { return std::make_unique<etcd::EtcdBackend>(c.config); }},
      {"etcd", [](const BackendContext& c) { return std::make_unique<etcd::EtcdBackend>(c.config); }},
  };
};

// Made at first use, so that registrations from other files' static objects find it
// whatever the order in which the program's objects start.
Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: registrations may run until exit
  return *r;
}

// --standalone replaces the backend with a store of its own (c10d's).
constexpr const char* kStandaloneBackend = "c10d";

}  // namespace

void registerBackend(const std::string& name, BackendMaker make) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (!r.makers.emplace(name, std::move(make)).second) {
    throw std::logic_error("rendezvous backend '" + name + "' is registered twice");
  }
}

std::vector<std::string> backendNames() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, make] : r.makers) names.push_back(name);
  return names;
}

std::unique_ptr<Backend> openBackend(const BackendContext& context) {
  const std::string& name = context.config.standalone ? kStandaloneBackend : context.config.backend;
  BackendMaker make;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    const auto it = r.makers.find(name);
    if (it != r.makers.end()) make = it->second;
  }
  if (!make) {
    throw UsageError(
        fmt::format("invalid --rdzv_backend value '{}': expected {}", name, fmt::join(backendNames(), ", ")));
  }
  return make(context);
}

std::unique_ptr<DynamicRendezvous> openRendezvous(const RendezvousConfig& config, int nproc_per_node,
                                                  RendezvousEnv& env) {
  return std::make_unique<DynamicRendezvous>(config, nproc_per_node, env, openBackend);
}

std::unique_ptr<StoreClient> connectToJob(const RendezvousConfig& config, StoreClientOptions options) {
  const RendezvousSettings settings = parseRendezvousSettings(config.conf);
  const std::string token = loadToken(settings.token_file);
  RendezvousEnv& env = RendezvousEnv::real();
  const auto backend = openBackend(BackendContext{config, settings, token, env, /*node=*/false});
  options.token = token;
  return backend->connect(options);
}

}  // namespace ddprun::rendezvous
