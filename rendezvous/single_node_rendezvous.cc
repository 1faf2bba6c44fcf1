#include "rendezvous/single_node_rendezvous.h"

#include "common/error.h"
#include "rendezvous/free_port.h"

namespace ddprun::rendezvous {

SingleNodeRendezvous::SingleNodeRendezvous(RendezvousConfig config) : config_(std::move(config)) {
  if (config_.min_nodes > 1) {
    throw RendezvousError("--nnodes=" + std::to_string(config_.min_nodes) +
                          (config_.max_nodes != config_.min_nodes ? ":" + std::to_string(config_.max_nodes) : "") +
                          " needs a multi-node rendezvous, which this build of ddprun does not have yet; "
                          "run one node (--standalone or --nnodes=1)");
  }
}

RendezvousResult SingleNodeRendezvous::next() {
  RendezvousResult result;
  result.group_rank = 0;
  result.group_world_size = 1;
  result.master_addr = config_.master_addr;
  result.master_port = config_.master_port ? *config_.master_port : findFreePort(config_.master_addr);
  result.use_agent_store = false;
  return result;
}

}  // namespace ddprun::rendezvous
