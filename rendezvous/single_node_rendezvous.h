// The rendezvous of a job that lives on one node: --standalone, or --nnodes=1 (or
// 1:MAX) with any backend. It forms at once with this node as group rank 0 and, as
// torch 1.13 does, hands the workers a MASTER_PORT on which the rank-0 worker hosts
// torch's TCPStore. Multi-node rendezvous over the agents' own store is a separate,
// larger piece (rendezvous issue); a config that needs it is refused here.
#pragma once

#include "rendezvous/rendezvous_config.h"

namespace ddprun::rendezvous {

class SingleNodeRendezvous {
 public:
  // Throws RendezvousError when the config needs more than one node.
  explicit SingleNodeRendezvous(RendezvousConfig config);

  // One round: returns at once. A fresh free port each round unless --master_port was
  // given, so a restarted group never races the previous attempt's store socket.
  RendezvousResult next();

 private:
  RendezvousConfig config_;
};

}  // namespace ddprun::rendezvous
