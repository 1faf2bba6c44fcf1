// --hang_timeout over this node's flight-recorder rings, the parts the hang watch
// (agent/hang_watch.h) asks at each look: how often it looks, where its ranks stand (a ring
// is matched by its rank only: a worker may be a wrapper of the process that writes it, sh -c
// or a Python parent), what triggers a verdict, and what it says when no ring showed up within
// a timeout of an attempt's start, rather than let the user believe that a job is watched that
// cannot be. Pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <spdlog/common.h>

#include "agent/hang/rings/hang_verdict.h"
#include "common/clock.h"
#include "common/flight_ring.h"

namespace ddprun::agent {

// A few looks per timeout, at most one a second, at least 50 ms apart: reading the rings is cheap.
Clock::Duration hangTimeoutLook(Clock::Duration timeout);

// The positions of the rings of `ranks` among `rings`, read at `now_ns` (the workers' steady clock).
std::vector<RankPosition> positionsOfRanks(const std::vector<FlightRingSnapshot>& rings, const std::vector<int>& ranks,
                                           int64_t now_ns);

// The verdict's trigger once no rank completed an operation for `timeout_s` while one was pending.
std::string hangTimeoutTrigger(double timeout_s);

// No ring after a timeout: with Python workers running with the hook, they have not called a
// collective yet (news, not a problem); else why nothing can be judged here: the hook turned
// off (`python_workers` without `python_stacks`), or workers that keep no rings at all.
struct NoRings {
  spdlog::level::level_enum level;
  std::string line;
};
NoRings noRingsLine(double timeout_s, bool python_running, bool python_workers, bool python_stacks);

}  // namespace ddprun::agent
