// The agents' own TCP store as a rendezvous backend (rendezvous/rounds/backend.h): c10d
// (--rdzv_endpoint host:port, hosted by the agent on that host or the one with is_host),
// static (--master_addr/--master_port, hosted by node 0, seats by --node_rank) and
// --standalone (a store of its own on 127.0.0.1, any port), whatever --rdzv_backend says.
#pragma once

#include <memory>

#include "rendezvous/rounds/backend.h"

namespace ddprun::rendezvous::c10d {

// --rdzv_backend=c10d and =static. Each hosts the store when this node should (a c10d
// endpoint this host already serves is joined instead). Throws RendezvousError (cannot
// host) or UsageError (bad endpoint, port 0 on a node that does not host).
std::unique_ptr<Backend> makeC10dBackend(const BackendContext& context);
std::unique_ptr<Backend> makeStaticBackend(const BackendContext& context);

}  // namespace ddprun::rendezvous::c10d
