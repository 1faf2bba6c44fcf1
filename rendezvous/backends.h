// The one place a rendezvous backend is picked (rendezvous/rounds/backend.h): a registry of
// backends by --rdzv_backend name, which the built-in ones (c10d, static, etcd-v2 and its
// alias etcd) are in from the start and any other adds itself to from its own folder
// (BackendRegistration), and what is made from it: the agent's rounds (openRendezvous)
// and a reader's connection to a running job's store (connectToJob: ddprun status).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "rendezvous/rounds/backend.h"
#include "rendezvous/rounds/dynamic_rendezvous.h"
#include "rendezvous/rounds/rendezvous_env.h"

namespace ddprun::rendezvous {

// Adds a backend under `name`. Throws std::logic_error when the name is taken. Thread-safe.
void registerBackend(const std::string& name, BackendMaker make);
// A backend that registers itself as the program starts: a static object in its own .cc,
//   const BackendRegistration kFile{"file", makeFileBackend};
// linked into the program as an object file (a static library's unreferenced members are
// left out).
struct BackendRegistration {
  BackendRegistration(const std::string& name, BackendMaker make) { registerBackend(name, std::move(make)); }
};
// The registered names, sorted.
std::vector<std::string> backendNames();

// The backend for context.config.backend (--standalone: c10d's, a store of its own, whatever
// the backend). Throws UsageError for a name nobody registered, and what the backend's maker
// throws.
std::unique_ptr<Backend> openBackend(const BackendContext& context);

// The job's rounds for its --rdzv_backend, in `env` (which must outlive them). Throws
// RendezvousError or UsageError (DynamicRendezvous's constructor).
std::unique_ptr<DynamicRendezvous> openRendezvous(const RendezvousConfig& config, int nproc_per_node,
                                                  RendezvousEnv& env = RendezvousEnv::real());

// A connection to the store of a running job, for a reader that is not one of its nodes:
// never hosts it; a TCP store is found at config.endpoint. The token comes from --rdzv_conf
// token_file or DDPRUN_TOKEN, as the agents'. Throws StoreError, UsageError.
std::unique_ptr<StoreClient> connectToJob(const RendezvousConfig& config, StoreClientOptions options);

}  // namespace ddprun::rendezvous
