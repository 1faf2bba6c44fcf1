// A rank's position for the node summaries' tests: it last completed all_reduce `completed`,
// a second ago, and waits in nothing.
#pragma once

#include <cstdint>

#include "agent/hang/rings/hang_verdict.h"

namespace ddprun::testing {

inline agent::RankPosition completedPosition(int rank, uint64_t completed) {
  agent::RankPosition p;
  p.rank = rank;
  p.last_completed_seq = completed;
  p.last_completed_op = FlightOp::kAllReduce;
  p.last_completed_age_s = 1;
  return p;
}

}  // namespace ddprun::testing
