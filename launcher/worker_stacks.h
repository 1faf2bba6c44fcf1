// `ddprun status --stacks --log_dir DIR`: every thread's native stack of the workers that
// an agent on this host runs now, without stopping them (agent/hang/stop/stack_capture.h). The
// workers are found in the agent's events file (worker_start events not followed by the
// worker's exit), and each is checked to be a live child of that agent, so that a reused
// pid is never attached to. Python stacks appear only on the kill path (faulthandler).
#pragma once

#include <sys/types.h>

#include <istream>
#include <string>
#include <vector>

namespace ddprun::launcher {

struct EventsWorker {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;
  int attempt = 0;
};

struct EventsAgent {
  std::string host;                   // from the "node" field, host:pid
  pid_t pid = 0;                      // the agent's pid; 0 when no line named it
  bool exited = false;                // an agent_exit event was written
  std::vector<EventsWorker> running;  // started and not seen to exit, in start order
};

// Reads an events file of one agent (the one under its run directory). Lines it cannot
// read are skipped. Never throws.
EventsAgent readEventsAgent(std::istream& events);

// Prints the stacks of the running workers that the events file `events_file` names to
// stdout (each with a header naming rank, local rank and pid). Blocks while the tool runs
// (at most 10 s). Returns 0 when it printed the stacks of at least one worker; 1, with a
// line on stderr, when the file names no running worker of a live agent on this host.
// Throws UsageError when the file cannot be read.
int printWorkerStacks(const std::string& events_file);

}  // namespace ddprun::launcher
