// Once a collective failed, the wait for this node's ranks' torch flight-recorder dumps
// (agent/torch_trace/torch_dumps.h) before they are judged (dump_judgement.h): the ranks
// still running write theirs when torch signals the timeout dump through the store (their
// watchdogs look about once a second), not torch's ~60 s later. Looks kTorchDumpSettleLook
// apart, so that a file's size holding still means that torch is done writing it; the
// caller's loop runs between them (the workers' output and exits served meanwhile).
#pragma once

#include <chrono>
#include <functional>

#include "common/clock.h"

namespace ddprun::agent {

class TorchDumps;

// The most a node waits for its ranks' dumps (and so, what a node judging a hang adds to its
// wait for the other nodes' summaries).
inline constexpr std::chrono::seconds kTorchDumpWait{3};
// With no dump at all after this long, none is coming (gloo before torch 2.8).
inline constexpr std::chrono::seconds kTorchFirstDumpWait{1};
inline constexpr std::chrono::milliseconds kTorchDumpSettleLook{100};

// Waits until every rank's dump was read or found unreadable, kTorchDumpWait at most, with
// `run_for` running the caller's loop on `clock` in between. Returns how long it waited.
std::chrono::milliseconds settleTorchDumps(TorchDumps& dumps, Clock& clock,
                                           const std::function<void(Clock::Duration)>& run_for);

}  // namespace ddprun::agent
