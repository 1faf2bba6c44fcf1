// Everything the elastic agent needs to run one node's share of a job. Built by the
// launcher from the command line; plain data, every field documents its default.
#pragma once

#include <chrono>
#include <csignal>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/output/std_streams.h"
#include "agent/placement/numa_binding.h"
#include "rendezvous/rounds/rendezvous_config.h"

namespace ddprun::agent {

// --recovery: what a failed worker costs the others (docs/recovery.md).
enum class Recovery {
  kRestart,  // the whole worker group restarts on every node (torchrun's way)
  kInJob,    // a failed worker on ddprun's runtime is replaced alone while the others run on
};

struct AgentConfig {
  // The worker command: argv[0] is an absolute path (python or the program itself).
  std::vector<std::string> entrypoint;
  // Short name of what runs, for the failure report title ("train.py", "-m pkg.mod").
  std::string entry_name;
  int nproc_per_node = 1;  // --nproc_per_node, resolved to a count.
  // --virtual_local_rank: each worker gets LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES naming its one device.
  bool virtual_local_rank = false;
  std::string role = "default";  // --role; ROLE_NAME.
  int max_restarts = 0;          // --max_restarts.
  // --recovery (PET_RECOVERY); default restart. With in-job, a replacement of a failed
  // worker counts against --max_restarts as a restart does (agent/in_job_recovery.h).
  Recovery recovery = Recovery::kRestart;
  // --recovery_spare (PET_RECOVERY_SPARE); default on. With --recovery=in-job, one warm spare
  // process per node takes a failed rank's place instead of a new process (in_job_recovery.h).
  bool recovery_spare = true;
  std::chrono::milliseconds monitor_interval{5000};  // --monitor_interval; only reported.
  std::chrono::milliseconds term_timeout{30000};     // --term_timeout: SIGTERM -> SIGKILL grace.
  // --signals_to_handle: signals that stop the job (forwarded, then SIGKILL after term_timeout).
  // SIGUSR1/SIGUSR2 not listed here are forwarded to the workers and the job goes on.
  std::vector<int> stop_signals{SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  std::optional<std::string> log_dir;               // --log_dir; unset: a temporary directory.
  StdSpec redirects;                                // -r/--redirects; default none.
  StdSpec tee;                                      // -t/--tee; default none.
  std::optional<std::set<int>> local_ranks_filter;  // --local_ranks_filter; unset: all.
  // --duplicate_stdout_filters / --duplicate_stderr_filters: teed lines containing any of
  // these also go to attempt_<k>/filtered_std{out,err}.log; empty (default): no such file.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  // --numa-binding: the CPUs of each local rank, planned at start; empty (default): unbound.
  std::optional<NumaMode> numa_binding;
  std::vector<CpuBinding> cpu_bindings;
  // --node_cooldown: how long a node whose workers failed twice in a row sits out of the
  // job (doubling with each further failure, up to node_cooldown_max); 0: never (torchrun).
  std::chrono::milliseconds node_cooldown{0};
  std::chrono::milliseconds node_cooldown_max{300000};  // --node_cooldown_max.
  std::optional<int> health_check_port;                 // --health_check_port; unset: no endpoint.
  std::string health_check_addr = "127.0.0.1";          // --health_check_addr: where it listens (loopback unless told).
  std::optional<std::string> events_file;               // DDPRUN_EVENTS_FILE; unset: events only in --log_dir.
  bool events_console = false;                          // --event_log_handler=console: events on stderr too.
  // Whether workers go into cgroups where they can be written (default yes); DDPRUN_NO_CGROUPS=1 (a boolean) turns
  // them off, leaving process groups alone to contain the workers.
  bool cgroups = true;
  // TORCHELASTIC_ENABLE_FILE_TIMER=1: serve torch's file timers on a named pipe (default off).
  bool file_timer = false;
  // --hang_timeout: no local rank has completed an operation (a collective or a point-to-point
  // message, flight recorder) for this long while one is pending: print the hang verdict, take
  // stacks, stop and restart. Unset (default): off.
  std::optional<std::chrono::milliseconds> hang_timeout;
  // --straggler_threshold: a rank that enters collectives this much later than its group's
  // median rank, on average over its last 64 (flight recorder; agent/hang/rings/straggler.h), is
  // named a straggler (event, log line, health check); 0: never. Default 0.5 s.
  std::chrono::milliseconds straggler_threshold{500};
  // The workers run Python (ddprun starts the interpreter, or the program is python*); default no.
  bool python_workers = false;
  // Python workers get PYTHONFAULTHANDLER=1 unless set; --no_python_faulthandler: not (default on).
  bool python_faulthandler = true;
  // Python workers get ddprun's startup hook (agent/hang/python/python_hook.h): their Python stacks can be
  // read without stopping them when a collective fails; --no_python_stacks: not (default on).
  bool python_stacks = true;
  // Python workers get torch's flight recorder variables (agent/hang/python/python_hook.h) unless set;
  // --no_torch_flight_recorder: not (default on).
  bool torch_flight_recorder = true;
  rendezvous::RendezvousConfig rendezvous;
};

}  // namespace ddprun::agent
