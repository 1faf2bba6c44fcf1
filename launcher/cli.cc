#include "launcher/cli.h"

#include <cstdlib>
#include <random>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "agent/ops/event_log.h"
#include "agent/output/filtered_log.h"
#include "agent/output/log_layout.h"
#include "agent/placement/numa_binding.h"
#include "agent/worker_env.h"
#include "common/env_names.h"
#include "common/env_reader.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/recovery_keys.h"
#include "common/text_escape.h"
#include "launcher/nproc.h"
#include "launcher/option_prefix.h"
#include "launcher/parse_number.h"
#include "launcher/program_resolver.h"
#include "launcher/rdzv_conf.h"
#include "launcher/signal_list.h"
#include "launcher/slurm_env.h"
#include "launcher/version.h"
#include "rendezvous/etcd/etcd_backend.h"

namespace ddprun::launcher {
namespace {

// Raw flag values as typed (or read from PET_*); validated after parsing so that every
// problem gets the same style of message.
struct RawFlags {
  std::string nnodes = "1:1";
  std::string nproc_per_node = "1";
  bool virtual_local_rank = false;
  std::string node_rank = "0";
  std::string master_addr = "127.0.0.1";
  std::string master_port;
  bool standalone = false;
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::string rdzv_id = "none";
  std::string rdzv_conf;
  std::string max_restarts = "0";
  std::string recovery = "restart";
  std::string recovery_spare = "on";
  std::string monitor_interval = "5";
  std::string role = "default";
  bool no_python = false;
  bool module = false;
  bool run_path = false;
  bool no_python_faulthandler = false;
  bool no_python_stacks = false;
  bool no_torch_flight_recorder = false;
  std::string log_dir;
  std::string redirects = "0";
  std::string tee = "0";
  std::string local_ranks_filter;
  std::string duplicate_stdout_filters;
  std::string duplicate_stderr_filters;
  std::string numa_binding;
  std::string local_addr;
  std::string start_method = "spawn";
  std::string logs_specs;                  // empty: not given (torchrun's None: its default logs)
  std::string event_log_handler = "null";  // torchrun's registered handlers: null, console
  std::string term_timeout = "30";
  std::string shutdown_timeout;   // torchrun's alias of --term_timeout; empty: not given.
  std::string signals_to_handle;  // empty: TORCHELASTIC_SIGNALS_TO_HANDLE, else torchrun's list.
  std::string node_cooldown = "0";
  std::string node_cooldown_max = "300";
  std::string hang_timeout;  // empty: off
  std::string straggler_threshold = "0.5";
  std::string health_check_port;
  std::string health_check_addr = "127.0.0.1";
  bool slurm = false;
  bool dry_run = false;
  bool version = false;
};

// "--nproc_per_node" -> "--nproc_per_node,--nproc-per-node"; the PET_ name follows torchrun.
std::string spellings(const std::string& underscore_name) {
  std::string dashed = underscore_name;
  for (size_t i = 2; i < dashed.size(); ++i) {
    if (dashed[i] == '_') dashed[i] = '-';
  }
  return dashed == underscore_name ? underscore_name : underscore_name + "," + dashed;
}

std::string petName(const std::string& long_name) {
  std::string name = "PET_";
  for (char c : long_name.substr(2)) name += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return name;
}

// torch 2.11's run.py options (get_args_parser), by their underscore names: a prefix that
// names one of these and some of ddprun's own flags means this one, as it does to torchrun.
const std::set<std::string> kTorchrunOptions{"--nnodes",
                                             "--nproc_per_node",
                                             "--rdzv_backend",
                                             "--rdzv_endpoint",
                                             "--rdzv_id",
                                             "--rdzv_conf",
                                             "--standalone",
                                             "--max_restarts",
                                             "--monitor_interval",
                                             "--start_method",
                                             "--event_log_handler",
                                             "--role",
                                             "--module",
                                             "--no_python",
                                             "--run_path",
                                             "--log_dir",
                                             "--redirects",
                                             "--tee",
                                             "--local_ranks_filter",
                                             "--node_rank",
                                             "--master_addr",
                                             "--master_port",
                                             "--local_addr",
                                             "--logs_specs",
                                             "--numa_binding",
                                             "--signals_to_handle"};

// The flags as defined, with where each one's value lives.
struct Registry {
  struct Entry {
    const CLI::Option* option;
    std::string name;  // underscore spelling, "--nproc_per_node"
    std::string* text = nullptr;
    bool* flag = nullptr;
  };
  std::vector<Entry> entries;
  std::set<const CLI::Option*> torchrun;
};

void addOption(CLI::App& app, Registry& registry, const std::string& short_name, const std::string& long_name,
               std::string& target, const std::string& help, bool pet = true) {
  std::string names = short_name.empty() ? spellings(long_name) : short_name + "," + spellings(long_name);
  CLI::Option* option = app.add_option(names, target, help)->capture_default_str();
  if (pet) option->envname(petName(long_name));
  registry.entries.push_back({option, long_name, &target, nullptr});
  if (kTorchrunOptions.count(long_name)) registry.torchrun.insert(option);
}

void addFlag(CLI::App& app, Registry& registry, const std::string& short_name, const std::string& long_name,
             bool& target, const std::string& help) {
  std::string names = short_name.empty() ? spellings(long_name) : short_name + "," + spellings(long_name);
  CLI::Option* option = app.add_flag(names, target, help)->envname(petName(long_name));
  registry.entries.push_back({option, long_name, nullptr, &target});
  if (kTorchrunOptions.count(long_name)) registry.torchrun.insert(option);
}

std::string randomRunId() {
  std::random_device device;
  std::uniform_int_distribution<uint32_t> dist;
  uint32_t a = dist(device), b = dist(device), c = dist(device), d = dist(device);
  return fmt::format("{:08x}-{:04x}-4{:03x}-{:04x}-{:04x}{:08x}", a, b >> 16, b & 0xfff, 0x8000 | (c >> 18), c & 0xffff,
                     d);
}

void parseNnodes(const std::string& text, int& min_nodes, int& max_nodes) {
  const char* expected = "N or MIN:MAX with 1 <= MIN <= MAX";
  auto colon = text.find(':');
  if (colon == std::string::npos) {
    min_nodes = max_nodes = parseInt("--nnodes", text, 1, 1 << 20, expected);
    return;
  }
  std::string_view view(text);
  try {
    min_nodes = parseInt("--nnodes", view.substr(0, colon), 1, 1 << 20, expected);
    max_nodes = parseInt("--nnodes", view.substr(colon + 1), 1, 1 << 20, expected);
  } catch (const UsageError&) {
    throw UsageError("invalid --nnodes value '" + text + "': expected " + expected);
  }
  if (min_nodes > max_nodes) {
    throw UsageError("invalid --nnodes value '" + text + "': MIN (" + std::to_string(min_nodes) +
                     ") is larger than MAX (" + std::to_string(max_nodes) + ")");
  }
}

void checkEndpoint(const std::string& endpoint) {
  std::string host = endpoint;
  std::string port;
  if (!endpoint.empty() && endpoint.front() == '[') {
    auto close = endpoint.find(']');
    if (close == std::string::npos) throw UsageError("invalid --rdzv_endpoint '" + endpoint + "': missing ']'");
    host = endpoint.substr(1, close - 1);
    if (close + 1 < endpoint.size()) {
      if (endpoint[close + 1] != ':') throw UsageError("invalid --rdzv_endpoint '" + endpoint + "'");
      port = endpoint.substr(close + 2);
    }
  } else if (auto colon = endpoint.rfind(':'); colon != std::string::npos) {
    host = endpoint.substr(0, colon);
    port = endpoint.substr(colon + 1);
  }
  if (host.empty()) throw UsageError("invalid --rdzv_endpoint '" + endpoint + "': no host");
  if (!port.empty() || endpoint.back() == ':') {
    parseInt("--rdzv_endpoint port", port, 0, 65535, "a port number 0-65535");
  }
}

std::set<int> parseRankList(const std::string& text) {
  std::set<int> ranks;
  std::string_view rest(text);
  while (true) {
    auto comma = rest.find(',');
    ranks.insert(parseInt("--local_ranks_filter", rest.substr(0, comma), 0, 1 << 20,
                          "a comma-separated list of local ranks, like 0,1"));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return ranks;
}

// As in torchrun, only teed streams are filtered: without --tee the file stays empty.
void warnIfNotTeed(const agent::AgentConfig& config, const char* stream, const std::vector<std::string>& filters,
                   bool (*includes)(agent::Std)) {
  if (filters.empty()) return;
  for (int rank = 0; rank < config.nproc_per_node; ++rank) {
    if (includes(config.tee.forLocalRank(rank))) return;
  }
  logger("launcher")
      ->warn("--duplicate_{}_filters applies to teed {} only, and no local rank tees it (--tee)", stream, stream);
}

std::chrono::milliseconds toMillis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

// --term_timeout and torchrun's --shutdown_timeout (and TORCH_ELASTIC_SHUTDOWN_TIMEOUT) are one
// setting; two given values must agree, so neither silently loses.
std::chrono::milliseconds resolveTermTimeout(const CLI::App& app, const RawFlags& f) {
  const bool term_given = app.get_option("--term_timeout")->count() > 0;
  const bool shutdown_given = app.get_option("--shutdown_timeout")->count() > 0;
  if (term_given && shutdown_given) {
    auto term = toMillis(parseSeconds("--term_timeout", f.term_timeout));
    if (term != toMillis(parseSeconds("--shutdown_timeout", f.shutdown_timeout))) {
      throw UsageError("--term_timeout " + f.term_timeout + " and --shutdown_timeout " + f.shutdown_timeout +
                       " disagree: they are one setting, give one of them");
    }
    return term;
  }
  if (shutdown_given) return toMillis(parseSeconds("--shutdown_timeout", f.shutdown_timeout));
  if (term_given) return toMillis(parseSeconds("--term_timeout", f.term_timeout));
  if (const char* env = std::getenv(env::kShutdownTimeout); env && *env) {
    return toMillis(parseSeconds(env::kShutdownTimeout, env));
  }
  return toMillis(parseSeconds("--term_timeout", f.term_timeout));
}

// The flag (or PET_SIGNALS_TO_HANDLE), else TORCHELASTIC_SIGNALS_TO_HANDLE, which torch's
// process layer reads, else torchrun's default list.
std::vector<int> resolveStopSignals(const RawFlags& f) {
  if (!f.signals_to_handle.empty()) return parseSignalList("--signals_to_handle", f.signals_to_handle);
  if (const char* env = std::getenv(env::kSignalsToHandle); env && *env) {
    return parseSignalList(env::kSignalsToHandle, env);
  }
  return parseSignalList("--signals_to_handle", kDefaultSignalsToHandle);
}

// --virtual_local_rank hands each local rank one entry of CUDA_VISIBLE_DEVICES; a list too
// short for --nproc_per_node is caught before anything starts, as torchrun fails on it.
void checkVirtualDevices(int nproc_per_node) {
  const char* visible = std::getenv(env::kCudaVisibleDevices);
  if (!visible) return;
  if (!agent::virtualDevice(std::string(visible), nproc_per_node - 1)) {
    throw UsageError(
        fmt::format("--virtual_local_rank: CUDA_VISIBLE_DEVICES='{}' has fewer than --nproc_per_node={} "
                    "entries, one per local rank",
                    visible, nproc_per_node));
  }
}

agent::AgentConfig buildConfig(const CLI::App& app, RawFlags& f, const std::vector<std::string>& program) {
  agent::AgentConfig config;
  auto& rdzv = config.rendezvous;
  parseNnodes(f.nnodes, rdzv.min_nodes, rdzv.max_nodes);
  config.nproc_per_node = resolveNprocPerNode(f.nproc_per_node);
  if (f.virtual_local_rank) checkVirtualDevices(config.nproc_per_node);
  config.virtual_local_rank = f.virtual_local_rank;
  rdzv.node_rank = parseInt("--node_rank", f.node_rank, 0, 1 << 20, "a non-negative integer");
  if (rdzv.node_rank >= rdzv.max_nodes) {
    throw UsageError("--node_rank " + f.node_rank + " is out of range for --nnodes " + f.nnodes);
  }
  if (f.master_addr.empty()) throw UsageError("--master_addr must not be empty");
  rdzv.master_addr = f.master_addr;
  if (!f.master_port.empty()) {
    rdzv.master_port = parseInt("--master_port", f.master_port, 0, 65535, "a port number 0-65535");
  }
  const bool etcd = rendezvous::etcd::isEtcdBackend(f.rdzv_backend);
  if (f.rdzv_backend != "static" && f.rdzv_backend != "c10d" && !etcd) {
    throw UsageError("invalid --rdzv_backend value '" + f.rdzv_backend + "': expected static, c10d or etcd-v2");
  }
  rdzv.backend = f.rdzv_backend;
  // The keys as --standalone's c10d store reads them where it replaces the backend.
  RdzvConf conf = rdzvConfForBackend(f.standalone ? "c10d" : f.rdzv_backend, splitRdzvConf(f.rdzv_conf));
  for (const std::string& warning : conf.warnings) logger("launcher")->warn("{}", warning);
  rdzv.conf = std::move(conf.conf);
  // Values are checked now, so a typo stops ddprun before anything starts.
  rendezvous::parseRendezvousSettings(rdzv.conf);
  if (!f.rdzv_endpoint.empty() && !etcd) checkEndpoint(f.rdzv_endpoint);
  rdzv.endpoint = f.rdzv_endpoint;
  // etcd's member list and TLS keys, checked now (the files are read when the agent starts).
  if (etcd && !f.standalone) rendezvous::etcd::parseEtcdSettings(rdzv, rendezvous::parseRendezvousSettings(rdzv.conf));
  if (f.rdzv_id.empty()) throw UsageError("--rdzv_id must not be empty");
  rdzv.run_id = f.rdzv_id;
  rdzv.local_addr = f.local_addr;
  if (f.standalone) {
    if (rdzv.min_nodes > 1) throw UsageError("--standalone runs a single node, but --nnodes is " + f.nnodes);
    rdzv.standalone = true;
    rdzv.backend = "c10d";
    rdzv.endpoint = "localhost:0";
    rdzv.run_id = randomRunId();
    rdzv.min_nodes = rdzv.max_nodes = 1;
  }
  if (rdzv.backend == "c10d" && rdzv.endpoint.empty()) {
    throw UsageError("--rdzv_backend=c10d needs --rdzv_endpoint host:port (or use --standalone)");
  }

  config.max_restarts = parseInt("--max_restarts", f.max_restarts, 0, 1 << 30, "a non-negative integer");
  config.monitor_interval = toMillis(parseSeconds("--monitor_interval", f.monitor_interval));
  config.term_timeout = resolveTermTimeout(app, f);
  config.stop_signals = resolveStopSignals(f);
  config.node_cooldown = toMillis(parseSeconds("--node_cooldown", f.node_cooldown));
  config.node_cooldown_max = toMillis(parseSeconds("--node_cooldown_max", f.node_cooldown_max));
  if (config.node_cooldown > config.node_cooldown_max) {
    throw UsageError("--node_cooldown " + f.node_cooldown + " is longer than --node_cooldown_max " +
                     f.node_cooldown_max);
  }
  if (!f.health_check_port.empty()) {
    config.health_check_port = parseInt("--health_check_port", f.health_check_port, 0, 65535, "a port number 0-65535");
  } else if (const char* port = std::getenv(env::kHealthCheckPort); port && *port) {
    // torch's agent serves its health check where this names; the flag wins over it.
    config.health_check_port = parseInt(env::kHealthCheckPort, port, 0, 65535, "a port number 0-65535");
  }
  config.health_check_addr = f.health_check_addr;
  if (!f.hang_timeout.empty()) {
    config.hang_timeout = toMillis(parseSeconds("--hang_timeout", f.hang_timeout));
    if (config.hang_timeout->count() <= 0) throw UsageError("--hang_timeout must be more than 0 seconds");
  }
  const double straggler_s = parseSeconds("--straggler_threshold", f.straggler_threshold);
  config.straggler_threshold = toMillis(straggler_s);
  if (config.straggler_threshold.count() == 0 && straggler_s > 0) {
    throw UsageError("--straggler_threshold " + f.straggler_threshold +
                     " is less than a millisecond: give 0.001 or more, or 0 to turn it off");
  }
  // As torch's agent: only the exact value 1 turns the file timers on.
  if (const char* timer = std::getenv(env::kEnableFileTimer); timer && std::string_view(timer) == "1") {
    config.file_timer = true;
  }
  config.python_faulthandler = !f.no_python_faulthandler;
  config.python_stacks = !f.no_python_stacks;
  config.torch_flight_recorder = !f.no_torch_flight_recorder;
  // A boolean: 1/true/yes turn cgroups off, 0/false/no (or empty) leave them on, anything else is refused.
  config.cgroups = !env::booleanOr(env::kNoCgroups, false);
  if (const char* events = std::getenv(env::kEventsFile); events && *events) {
    agent::checkAppendable(events);
    config.events_file = events;
  }
  if (f.recovery == recovery::kInJob) {
    config.recovery = agent::Recovery::kInJob;
  } else if (f.recovery != recovery::kRestart) {
    throw UsageError("invalid --recovery value '" + printable(f.recovery) + "': expected restart or in-job");
  }
  config.recovery_spare = env::parseBoolean("--recovery_spare", f.recovery_spare);
  if (f.role.empty()) throw UsageError("--role must not be empty");
  config.role = f.role;
  config.redirects = agent::StdSpec::parse("--redirects", f.redirects);
  config.tee = agent::StdSpec::parse("--tee", f.tee);
  if (!f.local_ranks_filter.empty()) config.local_ranks_filter = parseRankList(f.local_ranks_filter);
  config.duplicate_stdout_filters = agent::parseFilterList("--duplicate_stdout_filters", f.duplicate_stdout_filters);
  config.duplicate_stderr_filters = agent::parseFilterList("--duplicate_stderr_filters", f.duplicate_stderr_filters);
  warnIfNotTeed(config, "stdout", config.duplicate_stdout_filters, agent::includesStdout);
  warnIfNotTeed(config, "stderr", config.duplicate_stderr_filters, agent::includesStderr);
  if (!f.numa_binding.empty()) {
    config.numa_binding = agent::parseNumaMode(f.numa_binding);
    if (!config.numa_binding) {
      throw UsageError("invalid --numa-binding value '" + f.numa_binding +
                       "': expected node, socket, exclusive or core-complex");
    }
    config.cpu_bindings = agent::planNumaBindingForHost(*config.numa_binding, config.nproc_per_node);
  }
  if (!f.logs_specs.empty() && f.logs_specs != "default") {
    // torch looks the name up in the entry points of the group torchrun.logs_specs; ddprun's
    // own log layout is the one it has, under torch's name for its default.
    throw UsageError("could not find entry point under 'torchrun.logs_specs[" + printable(f.logs_specs) +
                     "]': ddprun has only 'default' (torch's default log layout)");
  }
  if (f.event_log_handler == "console") {
    config.events_console = true;
  } else if (f.event_log_handler != "null") {
    throw UsageError("invalid --event_log_handler value '" + printable(f.event_log_handler) +
                     "': expected null or console (torch's registered handlers)");
  }
  if (f.start_method != "spawn" && f.start_method != "fork" && f.start_method != "forkserver") {
    throw UsageError("invalid --start_method value '" + f.start_method + "': expected spawn, fork or forkserver");
  }
  if (!f.log_dir.empty()) {
    agent::ensureWritableDirectory(f.log_dir);
    config.log_dir = f.log_dir;
  }

  if (f.dry_run && program.empty()) return config;  // --dry_run may leave out the program.
  ProgramRequest request;
  request.script = program.empty() ? "" : program.front();
  if (!program.empty()) request.args.assign(program.begin() + 1, program.end());
  request.no_python = f.no_python;
  request.module = f.module;
  request.run_path = f.run_path;
  ResolvedProgram resolved = resolveProgram(request);
  config.entrypoint = std::move(resolved.argv);
  config.entry_name = std::move(resolved.display_name);
  config.python_workers = resolved.python;
  return config;
}

// --slurm: the flags the command line (and PET_*) left open, from the job step's variables.
void applySlurm(const CLI::App& app, RawFlags& f) {
  if (f.standalone) throw UsageError("--slurm and --standalone cannot be combined: a SLURM job step spans its nodes");
  const std::map<std::string, std::string*> targets{{"nnodes", &f.nnodes},
                                                    {"node_rank", &f.node_rank},
                                                    {"master_addr", &f.master_addr},
                                                    {"master_port", &f.master_port},
                                                    {"rdzv_endpoint", &f.rdzv_endpoint},
                                                    {"rdzv_id", &f.rdzv_id},
                                                    {"nproc_per_node", &f.nproc_per_node}};
  std::set<std::string> given;
  for (const auto& [name, target] : targets) {
    if (app.get_option("--" + name)->count() > 0) given.insert(name);
  }
  for (const SlurmFlag& flag : deriveSlurmFlags(processEnvironment(), given, f.rdzv_backend)) {
    *targets.at(flag.name) = flag.value;
    logger("launcher")->debug("--slurm: --{}={} (from {})", flag.name, flag.value, flag.source);
  }
}

// --dry_run: the resolved flags that shape the job, one per line, as ddprun would take them.
std::string describeFlags(const agent::AgentConfig& config) {
  const auto& rdzv = config.rendezvous;
  std::string text = rdzv.min_nodes == rdzv.max_nodes ? fmt::format("--nnodes={}\n", rdzv.min_nodes)
                                                      : fmt::format("--nnodes={}:{}\n", rdzv.min_nodes, rdzv.max_nodes);
  text += fmt::format("--nproc_per_node={}\n--rdzv_backend={}\n", config.nproc_per_node, rdzv.backend);
  if (rdzv.backend == "static") {
    text += fmt::format("--node_rank={}\n--master_addr={}\n", rdzv.node_rank, rdzv.master_addr);
    if (rdzv.master_port) text += fmt::format("--master_port={}\n", *rdzv.master_port);
  } else {
    text += fmt::format("--rdzv_endpoint={}\n", rdzv.endpoint);
  }
  text += fmt::format("--rdzv_id={}\n--max_restarts={}\n", rdzv.run_id, config.max_restarts);
  // Only when not the default, so that a job's dry run reads as it did before the flag.
  if (config.recovery == agent::Recovery::kInJob) text += fmt::format("--recovery={}\n", recovery::kInJob);
  if (!config.recovery_spare) text += "--recovery_spare=off\n";
  return text;
}

// ddprun's flags on `app`, each recorded in `registry`.
void defineFlags(CLI::App& app, RawFlags& f, Registry& registry) {
  app.prefix_command();
  app.get_formatter()->column_width(34);

  addOption(app, registry, "", "--nnodes", f.nnodes,
            "Number of nodes, or the range of nodes in form <minimum_nodes>:<maximum_nodes>.");
  addOption(app, registry, "", "--nproc_per_node", f.nproc_per_node,
            "Number of workers per node; supported values: [auto, cpu, gpu, xpu, int].");
  addFlag(app, registry, "", "--virtual_local_rank", f.virtual_local_rank,
          "Every worker gets LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES naming only its own device.");
  addOption(app, registry, "", "--node_rank", f.node_rank,
            "Rank of the node for multi-node distributed training (static rendezvous).");
  addOption(app, registry, "", "--master_addr", f.master_addr,
            "Address of the master node (rank 0) for static rendezvous.");
  addOption(app, registry, "", "--master_port", f.master_port,
            "Port on the master node for static rendezvous (default: a port from the kernel on one node, 29500 on "
            "several; 0: node 0 takes one from the kernel and prints it).");
  addFlag(app, registry, "", "--standalone", f.standalone,
          "Single-node job with a local rendezvous on a free port; no --rdzv_* flags needed.");
  addOption(app, registry, "", "--rdzv_backend", f.rdzv_backend,
            "Rendezvous backend: static, c10d or etcd-v2 (alias etcd).");
  addOption(app, registry, "", "--rdzv_endpoint", f.rdzv_endpoint,
            "Rendezvous backend endpoint, usually in form <host>:<port>.");
  addOption(app, registry, "", "--rdzv_id", f.rdzv_id, "User-defined group id (the job id).");
  addOption(app, registry, "", "--rdzv_conf", f.rdzv_conf,
            "Additional rendezvous configuration (<key1>=<value1>,<key2>=<value2>,...).");
  addOption(app, registry, "", "--max_restarts", f.max_restarts,
            "Maximum number of worker group restarts before failing.");
  addOption(app, registry, "", "--recovery", f.recovery,
            "What a failed worker costs the others: restart (default: the whole worker group restarts) or in-job "
            "(a worker on ddprun's runtime is replaced alone while the others keep running; each replacement "
            "counts as a restart; docs/recovery.md).");
  addOption(app, registry, "", "--recovery_spare", f.recovery_spare,
            "With --recovery=in-job: keep one spare worker process per node, loaded and waiting, that takes a "
            "failed worker's place instead of a new process (on, the default, or off; docs/recovery.md).");
  addOption(app, registry, "", "--monitor_interval", f.monitor_interval,
            "Accepted for torchrun compatibility; ddprun sees worker exits as they happen.");
  addOption(app, registry, "", "--role", f.role, "User-defined role for the workers (ROLE_NAME).");
  addFlag(app, registry, "", "--no_python", f.no_python,
          "Exec the training script directly instead of prepending 'python -u'.");
  addFlag(app, registry, "-m", "--module", f.module, "Run the training script as a Python module ('python -m').");
  addFlag(
      app, registry, "", "--run_path", f.run_path,
      "Run the training script with python, whatever its name (torch: runpy.run_path); wins over --no_python and -m.");
  addFlag(app, registry, "", "--no_python_faulthandler", f.no_python_faulthandler,
          "Do not set PYTHONFAULTHANDLER=1 for Python workers (with it, a worker stopped as hung prints its Python "
          "tracebacks).");
  addFlag(app, registry, "", "--no_python_stacks", f.no_python_stacks,
          "Do not put ddprun's startup hook on Python workers' PYTHONPATH (with it, when a collective fails, ddprun "
          "reads every rank's Python stack and names the rank that is behind).");
  addFlag(app, registry, "", "--no_torch_flight_recorder", f.no_torch_flight_recorder,
          "Do not set torch's flight recorder variables (TORCH_NCCL_TRACE_BUFFER_SIZE, TORCH_FR_BUFFER_SIZE, "
          "TORCH_NCCL_DUMP_ON_TIMEOUT, TORCH_NCCL_DEBUG_INFO_TEMP_FILE, TORCH_FR_DUMP_TEMP_FILE) for Python workers.");
  addOption(app, registry, "", "--log_dir", f.log_dir,
            "Base directory for log files (<run_id>_<unique>/attempt_<k>/<local_rank>/).");
  addOption(
      app, registry, "-r", "--redirects", f.redirects,
      "Redirect std streams into log files: 0 none, 1 stdout, 2 stderr, 3 both; or per local rank, e.g. 0:1,1:2.");
  addOption(app, registry, "-t", "--tee", f.tee,
            "Tee std streams into log files and the console (same values as --redirects).");
  addOption(app, registry, "", "--local_ranks_filter", f.local_ranks_filter,
            "Show console output only from these local ranks, e.g. 0,1.");
  addOption(app, registry, "", "--duplicate_stdout_filters", f.duplicate_stdout_filters,
            "Also copy teed stdout lines containing any of these comma-separated strings (,, for a comma) to "
            "attempt_<k>/filtered_stdout.log.");
  addOption(app, registry, "", "--duplicate_stderr_filters", f.duplicate_stderr_filters,
            "Also copy teed stderr lines containing any of these comma-separated strings (,, for a comma) to "
            "attempt_<k>/filtered_stderr.log.");
  addOption(
      app, registry, "", "--numa_binding", f.numa_binding,
      "Bind each worker to the CPUs near its GPU (local rank = GPU index): node, socket, exclusive or core-complex.");
  addOption(app, registry, "", "--local_addr", f.local_addr,
            "Address of this node for the rendezvous (default: its host name).");
  addOption(app, registry, "", "--start_method", f.start_method,
            "Accepted for torchrun compatibility (spawn, fork, forkserver); workers are native processes.");
  addOption(app, registry, "", "--logs_specs", f.logs_specs,
            "torchrun's logs_specs entry point: only 'default' (ddprun's log layout, as torch's default).",
            /*pet=*/false);
  addOption(app, registry, "", "--event_log_handler", f.event_log_handler,
            "Where ddprun's events also go: null (only the events files) or console (one JSON line per event on "
            "stderr, as torch's console handler).");
  addOption(app, registry, "", "--hang_timeout", f.hang_timeout,
            "Seconds without any local rank completing an operation (a collective or a point-to-point message) while "
            "one is pending before ddprun calls the job hung: it prints where every rank stands, takes stacks and "
            "restarts (default: off).");
  addOption(app, registry, "", "--straggler_threshold", f.straggler_threshold,
            "Seconds a rank may enter collectives after its group's median rank, on average over its last 64, "
            "before it is named a straggler (event, log line, health check); 0: never.");
  addOption(app, registry, "", "--term_timeout", f.term_timeout,
            "Seconds between SIGTERM and SIGKILL when stopping workers.");
  addOption(app, registry, "", "--shutdown_timeout", f.shutdown_timeout,
            "torchrun's name for --term_timeout (default: TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30).");
  addOption(app, registry, "", "--signals_to_handle", f.signals_to_handle,
            "Comma-separated signals that stop the job (default: TORCHELASTIC_SIGNALS_TO_HANDLE, else "
            "SIGTERM,SIGINT,SIGHUP,SIGQUIT); SIGUSR1/SIGUSR2 not listed are forwarded to the workers.");
  addOption(app, registry, "", "--node_cooldown", f.node_cooldown,
            "Seconds a node whose workers failed twice in a row sits out of the job, doubling with each further "
            "failure (0: never).");
  addOption(app, registry, "", "--node_cooldown_max", f.node_cooldown_max,
            "Longest cooldown of a failing node, in seconds.");
  addOption(app, registry, "", "--health_check_port", f.health_check_port,
            "Serve the agent's health on this port (HTTP GET: 200 and its state as JSON while healthy, else 503).");
  addOption(app, registry, "", "--health_check_addr", f.health_check_addr,
            "Address the health check listens on (default loopback; 0.0.0.0 or the node's address for probes from "
            "elsewhere).");
  addFlag(app, registry, "", "--slurm", f.slurm,
          "Take --nnodes, --node_rank, --master_addr/--master_port (or --rdzv_endpoint), --rdzv_id and "
          "--nproc_per_node from SLURM's job step variables unless given.");
  addFlag(app, registry, "", "--dry_run", f.dry_run,
          "Print the resolved flags, one per line, and exit without starting anything.");
  // No PET_VERSION: an exported variable must never turn a job into a version print.
  app.add_flag("--version", f.version,
               "Print ddprun's version, its git revision and the torch store wire generations it speaks.");
  app.footer(
      "positional arguments:\n  training_script [args...]   The program to launch in parallel, followed by its "
      "arguments.");
}

CLI::App makeApp() {
  return CLI::App{
      "ddprun: a native, torchrun-compatible launcher for distributed training.\n"
      "Starts --nproc_per_node workers on this node with torchrun's environment (RANK, LOCAL_RANK,\n"
      "WORLD_SIZE, MASTER_ADDR, ...), restarts them on failure and reports what failed.\n"
      "Every flag can also be set through PET_<FLAG> (e.g. PET_NPROC_PER_NODE); the command line wins.\n"
      "A long flag may be shortened to any prefix that names one flag (--redirect=3), as torchrun's.",
      "ddprun"};
}

}  // namespace

ParsedCommandLine parseCommandLine(int argc, const char* const* argv) {
  RawFlags f;
  Registry registry;
  CLI::App app = makeApp();
  defineFlags(app, f, registry);

  ArgvRules rules;
  rules.preferred = registry.torchrun;
  const std::vector<std::string> args = normalizeArgv(app, std::vector<std::string>(argv, argv + argc), rules);
  std::vector<const char*> arg_pointers;
  for (const auto& a : args) arg_pointers.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(arg_pointers.size()), arg_pointers.data());
  } catch (const CLI::CallForHelp&) {
    ParsedCommandLine parsed;
    parsed.help_text = app.help();
    return parsed;
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  std::vector<std::string> program = app.remaining();
  if (!program.empty() && program.front().size() > 1 && program.front()[0] == '-') {
    throw UsageError("unrecognized argument: " + printable(program.front()) + " (see ddprun --help)");
  }
  if (!program.empty() && program.front() == "--") program.erase(program.begin());
  if (f.version) {
    ParsedCommandLine parsed;
    parsed.version_text = versionText();
    return parsed;
  }
  if (f.slurm) applySlurm(app, f);
  ParsedCommandLine parsed;
  parsed.config = buildConfig(app, f, program);
  if (f.dry_run) parsed.dry_run_text = describeFlags(parsed.config);
  parsed.start_method = f.start_method;
  for (const Registry::Entry& entry : registry.entries) {
    parsed.flag_values[entry.name] = entry.text ? *entry.text : (*entry.flag ? "true" : "false");
  }
  return parsed;
}

std::vector<LauncherOption> launcherOptions() {
  RawFlags f;
  Registry registry;
  CLI::App app = makeApp();
  defineFlags(app, f, registry);
  std::vector<LauncherOption> options;
  for (const Registry::Entry& entry : registry.entries) {
    LauncherOption option;
    for (const std::string& name : entry.option->get_lnames()) option.names.push_back("--" + name);
    for (const std::string& name : entry.option->get_snames()) option.names.push_back("-" + name);
    option.env_name = entry.option->get_envname();
    option.takes_value = entry.text != nullptr;
    option.default_text = entry.text ? *entry.text : "false";
    option.torchrun = registry.torchrun.count(entry.option) > 0;
    options.push_back(std::move(option));
  }
  return options;
}

}  // namespace ddprun::launcher
