// The warm spare's side in the runtime (--recovery=in-job; common/recovery_keys.h): a
// process the agent started with DDPRUN_SPARE=1 has no rank yet. Before the program's main
// runs (a static initializer of this file, which every program on the runtime links through
// env_contract.cc), it waits for its assignment on the pipe DDPRUN_SPARE_FD names, applies
// it to its environment and returns: from main on the program runs exactly as a replacement
// the agent started, with the same environment, so a trainer that reads RANK itself, before
// init_process_group, reads the assigned one. By then the process has started, LibTorch and
// the runtime are loaded and initialized: what a started replacement spends most of its
// start on. The pipe closed before a whole assignment: the agent retired the spare (its
// attempt ended) or died; the process exits 0 without running the program.
#pragma once

namespace ddprun::runtime {

// Waits for and applies the assignment when this process is a spare; returns at once
// otherwise and on every call after the first. A malformed DDPRUN_SPARE_FD or assignment, or
// a read error, ends the process with one line on stderr and exit code 2 (it runs before
// main, where an exception could only terminate). Blocks until the agent assigns the spare.
// Thread-safe (the first call does the work; the others wait for it).
void awaitSpareAssignment();

}  // namespace ddprun::runtime
