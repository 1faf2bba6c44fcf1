// One worker of this node's group in one attempt, as the agent's parts see it: where it sits
// in the job, its process and how it ended, and what was learnt about it on the way (its
// stderr's tail, its stacks when ddprun stopped it as hung, torch's dump file). A value;
// the worker group (worker_group.h) owns the attempt's workers.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "agent/hang/stop/hung_worker_stop.h"
#include "agent/output/line_forwarder.h"
#include "agent/torch_trace/torch_dumps.h"
#include "agent/worker_env.h"

namespace ddprun::agent {

struct Worker {
  WorkerPlace place;
  pid_t pid = -1;
  int generation = 0;  // DDPRUN_GENERATION it started in: above 0 for a replacement (--recovery=in-job)
  bool running = false;
  bool stopped_by_agent = false;
  int exit_code = 0;
  int signal = 0;
  std::chrono::system_clock::time_point exit_time;
  std::string error_file;
  std::shared_ptr<StreamRecord> stderr_record;  // when stderr goes through the agent
  std::string dir;                              // its log directory in this attempt
  bool python_faulthandler = false;             // a Python worker with PYTHONFAULTHANDLER: SIGABRT before a hang kill
  std::string hang_reason;                      // set when ddprun stopped it as hung ("timer 'step' expired")
  std::optional<HungStop> hang;                 // its stacks, then
  bool abandoned = false;                       // survived SIGKILL (uninterruptible sleep); no longer waited for
  bool left_group = false;                      // found outside its own process group (said once)
  bool python_hook = false;                     // it got ddprun's Python hook (python_hook.h)
  std::string python_stack;                     // its Python stacks (faulthandler), taken by the hang watch
  std::string python_stack_file;                // where they are
  std::string torch_dump;                       // where torch writes its flight-recorder dump; empty: nowhere known
  FileStamp torch_dump_before;                  // that file when the worker started
  bool failed() const { return !running && !stopped_by_agent && (signal != 0 || exit_code != 0); }
};

}  // namespace ddprun::agent
