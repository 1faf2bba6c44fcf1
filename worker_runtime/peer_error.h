// The one error for "a peer failed": collectives, point-to-point messages and RPC all throw
// it, so a worker catches one type whichever part of the runtime noticed the peer go.
#pragma once

#include "common/error.h"

namespace ddprun::runtime {

// A peer failed, vanished, or did not answer in time. The message names the operation,
// the peer rank and its address.
class PeerError : public DdprunError {
 public:
  using DdprunError::DdprunError;
};

}  // namespace ddprun::runtime
