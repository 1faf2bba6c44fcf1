#include "launcher/status_command.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include "agent/hang/rings/hang_verdict.h"
#include "agent/hang/rings/straggler.h"
#include "agent/ops/event_log.h"
#include "common/error.h"
#include "common/json_writer.h"
#include "common/logging.h"
#include "common/text_escape.h"
#include "launcher/rdzv_conf.h"
#include "launcher/subcommand_args.h"
#include "launcher/worker_stacks.h"
#include "rendezvous/backends.h"
#include "rendezvous/board/job_board.h"
#include "rendezvous/c10d/local_addresses.h"
#include "rendezvous/etcd/etcd_backend.h"
#include "rendezvous/store/tcp_store_client.h"
#include "rendezvous/store/token_auth.h"

namespace ddprun::launcher {
namespace {
namespace fs = std::filesystem;
using ddprun::JsonObject;
using rendezvous::AgentRecord;
using rendezvous::JobStatus;

constexpr auto kConnectTimeout = std::chrono::seconds(5);
constexpr auto kOperationTimeout = std::chrono::seconds(10);

// The value of a string field in one of ddprun's own JSON lines ("key":"value").
std::optional<std::string> stringField(const std::string& line, const std::string& key) {
  const std::string head = jsonString(key) + ":\"";
  auto at = line.find(head);
  if (at == std::string::npos) return std::nullopt;
  std::string value;
  for (size_t i = at + head.size(); i < line.size(); ++i) {
    if (line[i] == '"') return value;
    if (line[i] == '\\' && i + 1 < line.size()) {
      ++i;
      value += line[i] == 'n' ? '\n' : line[i] == 't' ? '\t' : line[i];
    } else {
      value += line[i];
    }
  }
  return std::nullopt;
}

// What the table shows as the node's state: its own word, unless it went silent.
std::string shownState(const AgentRecord& a, int64_t now_ms) {
  if (a.state == "exited") return "exited(" + std::to_string(a.exit_code) + ")";
  if (rendezvous::agentLost(a, now_ms)) return "lost";
  return a.state;
}

std::string ago(int64_t then_ms, int64_t now_ms) {
  return fmt::format("{:.1f}s ago", std::max<int64_t>(0, now_ms - then_ms) / 1000.0);
}

// The columns of `text`, valid UTF-8 as printable() leaves it: one per character.
size_t columns(std::string_view text) {
  return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// A table cell from a store's record: escaped, and cut to kStatusCellColumns ("..." in its
// last three), so that one forged field widens neither its column nor every line.
std::string cell(std::string_view raw) {
  std::string text = printable(raw);
  if (columns(text) <= kStatusCellColumns) return text;
  // Cut where the character after the first kStatusCellColumns - 3 starts.
  size_t end = 0;
  for (size_t kept = 0; end < text.size(); ++end) {
    if ((text[end] & 0xC0) != 0x80 && kept++ == kStatusCellColumns - 3) break;
  }
  text.resize(end);
  return text + "...";
}

std::string rankRange(const AgentRecord& a) {
  if (a.round < 0 || a.nproc <= 0) return "-";
  if (a.nproc == 1) return std::to_string(a.rank_base);
  return fmt::format("{}-{}", a.rank_base, a.rank_base + a.nproc - 1);
}

// Each local worker's generation, by local rank ("0,1": local rank 1 was replaced alone
// once); "-" before the node's workers start.
std::string generationsCell(const AgentRecord& a) {
  if (a.generations.empty()) return "-";
  return fmt::format("{}", fmt::join(a.generations, ","));
}

}  // namespace

bool isStatusCommand(int argc, const char* const* argv) { return argc >= 2 && std::string_view(argv[1]) == "status"; }

std::string formatStatusTable(const JobStatus& s) {
  // The store's text is escaped wherever it shows: the run id and store come from the user
  // or an events file, the end reason and the records from whoever can write to the store.
  std::string out = fmt::format("job {}  store {}  ", printable(s.run_id), printable(s.store));
  if (s.round < 0) {
    out += "no round yet\n";
  } else {
    out += fmt::format("round {} {}", s.round, s.round_state);
    if (s.round_state == "ended") out += " (" + cell(s.end_reason) + ")";
    if (s.nodes_in_round > 0) out += fmt::format("  nodes {}  world size {}", s.nodes_in_round, s.world_size);
    out += fmt::format("  restarts {}/{}\n", s.restarts, s.max_restarts);
  }
  std::vector<std::vector<std::string>> rows = {
      {"NODE", "ADDRESS", "STATE", "ROUND", "GROUP", "RANKS", "GENERATIONS", "RESTARTS", "FAILURES", "LAST HEARTBEAT"}};
  for (const AgentRecord& a : s.agents) {
    std::string beat = ago(a.heartbeat_ms, s.now_ms);
    if (a.state == "cooldown" && a.cooldown_until_ms > s.now_ms) {
      beat += fmt::format(" (back in {:.1f}s)", (a.cooldown_until_ms - s.now_ms) / 1000.0);
    }
    rows.push_back({cell(a.node), cell(a.address), cell(shownState(a, s.now_ms)),
                    a.round < 0 ? "-" : std::to_string(a.round), a.group_rank < 0 ? "-" : std::to_string(a.group_rank),
                    rankRange(a), cell(generationsCell(a)), std::to_string(a.restarts),
                    std::to_string(a.consecutive_failures), beat});
  }
  std::vector<size_t> width(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], columns(row[i]));
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - columns(row[i]) + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

namespace {

JsonObject statusObject(const JobStatus& s) {
  JsonObject o;
  o.add("run_id", s.run_id).add("store", s.store);
  if (s.round >= 0) {
    o.add("round", s.round).add("round_state", s.round_state);
  } else {
    o.addNull("round").addNull("round_state");
  }
  if (s.round_state == "ended") {
    o.add("end_reason", s.end_reason);
  } else {
    o.addNull("end_reason");
  }
  o.add("nodes_in_round", s.nodes_in_round).add("world_size", s.world_size);
  o.add("restarts", s.restarts).add("max_restarts", s.max_restarts).add("unix_ms", s.now_ms);
  std::vector<JsonObject> nodes;
  for (const AgentRecord& a : s.agents) {
    JsonObject n;
    n.add("node", a.node)
        .add("address", a.address)
        .add("state", a.state)
        .add("lost", rendezvous::agentLost(a, s.now_ms));
    n.add("round", a.round).add("group_rank", a.group_rank);
    if (a.round >= 0) {
      n.add("first_rank", a.rank_base).add("last_rank", a.rank_base + a.nproc - 1);
    } else {
      n.addNull("first_rank").addNull("last_rank");
    }
    n.add("nproc_per_node", a.nproc).add("restarts", a.restarts).add("max_restarts", a.max_restarts);
    // By local rank: above 0 for a worker that replaced a failed one alone (--recovery=in-job).
    n.raw("worker_generations", fmt::format("[{}]", fmt::join(a.generations, ",")));
    n.add("consecutive_failures", a.consecutive_failures);
    n.add("last_heartbeat_unix_ms", a.heartbeat_ms)
        .add("last_heartbeat_age_s", std::max<int64_t>(0, s.now_ms - a.heartbeat_ms) / 1000.0);
    if (a.state == "cooldown") {
      n.add("cooldown_until_unix_ms", a.cooldown_until_ms);
    } else {
      n.addNull("cooldown_until_unix_ms");
    }
    if (a.state == "exited") {
      n.add("exit_code", a.exit_code);
    } else {
      n.addNull("exit_code");
    }
    nodes.push_back(std::move(n));
  }
  o.add("nodes", nodes);
  return o;
}

// Each rank's lag over the whole job (straggler.h), and the threshold the round's first node
// published (0: none published, or off).
struct JobLags {
  std::vector<agent::RankLag> lags;
  double threshold_s = 0;
  int64_t oldest_ms = 0;  // the oldest summary's time
};

JobLags lagsOf(const JobProgress& progress) {
  JobLags out;
  std::vector<agent::RankProgress> all;
  std::set<std::pair<int, int>> seen;
  for (const auto& node : progress.nodes) {
    if (&node == &progress.nodes.front()) out.threshold_s = node.progress.threshold_s;
    if (out.oldest_ms == 0 || node.progress.unix_ms < out.oldest_ms) out.oldest_ms = node.progress.unix_ms;
    // A rank two nodes claim (a forged value) counts once.
    for (const auto& r : node.progress.ranks) {
      if (seen.emplace(r.rank, r.group).second) all.push_back(r);
    }
  }
  out.lags = agent::lagsOf(all, agent::groupMedians(all));
  return out;
}

bool straggles(const agent::RankLag& lag, double threshold_s) { return threshold_s > 0 && lag.lag_s > threshold_s; }

// A rank's current collective as --trace shows it.
struct TraceRow {
  int rank = 0;
  int group = 0;
  uint64_t seq = 0;  // 0: none yet
  std::string op;
  std::string state;  // pending, started, failed, completed, idle
  double age_s = 0;   // since it started (or was enqueued, or completed), as of the reading
  // Where it comes from: "torch" (the worker's live flight-recorder trace, which sees the
  // collectives torch issues from C++ too) or "ring" (ddprun's ring, written by its hook or runtime).
  std::string source = "ring";
  // Whether it names a collective (a ring's idle rank names none).
  bool named() const { return seq > 0 || source == "torch"; }
};

std::vector<TraceRow> traceOf(const JobProgress& progress, int64_t now_ms) {
  std::vector<TraceRow> rows;
  std::set<std::pair<int, int>> seen;
  // A rank with rows from torch's live trace shows those only: its rings miss what torch issues
  // from C++, and their groups need not be numbered as torch's are.
  std::set<int> traced;
  for (const auto& node : progress.nodes) {
    const double since_s = std::max<int64_t>(0, now_ms - node.progress.unix_ms) / 1000.0;
    for (const agent::TracePosition& t : node.progress.traces) {
      traced.insert(t.rank);
      if (!seen.emplace(t.rank, t.group).second) continue;
      rows.push_back(
          TraceRow{t.rank, t.group, t.seq, t.op, agent::traceStateName(t.state), t.age_s + since_s, "torch"});
    }
  }
  for (const auto& node : progress.nodes) {
    const double since_s = std::max<int64_t>(0, now_ms - node.progress.unix_ms) / 1000.0;
    for (const agent::RankPosition& p : node.progress.positions) {
      if (traced.count(p.rank) || !seen.emplace(p.rank, p.group).second) continue;
      TraceRow row{p.rank, p.group, 0, "-", "idle", 0};
      if (p.pending) {
        row.seq = p.pending->seq;
        row.op = std::string(flightOpName(p.pending->info.op));
        row.state = p.pending->state == FlightState::kFailed ? "failed"
                    : p.pending->started_ns != 0             ? "started"
                                                             : "pending";
        row.age_s = p.pending_age_s + since_s;
      } else if (p.last_completed_seq > 0) {
        row.seq = p.last_completed_seq;
        row.op = std::string(flightOpName(p.last_completed_op));
        row.state = "completed";
        row.age_s = std::max(0.0, p.last_completed_age_s) + since_s;
      }
      rows.push_back(std::move(row));
    }
  }
  std::sort(rows.begin(), rows.end(), [](const TraceRow& a, const TraceRow& b) {
    return std::pair(a.rank, a.group) < std::pair(b.rank, b.group);
  });
  return rows;
}

std::string alignedRows(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], columns(row[i]));
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - columns(row[i]) + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace

std::string formatStatusJson(const JobStatus& s) { return statusObject(s).str() + "\n"; }

std::string formatStatusJson(const JobStatus& s, const JobProgress& progress, bool trace) {
  JsonObject o = statusObject(s);
  const JobLags lags = lagsOf(progress);
  o.add("straggler_threshold_s", lags.threshold_s);
  std::string stragglers = "[";
  std::vector<JsonObject> ranks;
  for (const agent::RankLag& l : lags.lags) {
    const bool straggler = straggles(l, lags.threshold_s);
    if (straggler) stragglers += (stragglers.size() > 1 ? "," : "") + std::to_string(l.rank);
    ranks.push_back(JsonObject()
                        .add("rank", l.rank)
                        .add("group", l.group)
                        .add("lag_s", l.lag_s)
                        .add("mean_wait_s", l.mean_wait_s)
                        .add("collectives", l.collectives)
                        .add("last_seq", l.last_completed_seq)
                        .add("straggler", straggler));
  }
  o.raw("stragglers", stragglers + "]");
  o.add("ranks", ranks);
  if (trace) {
    std::vector<JsonObject> rows;
    for (const TraceRow& r : traceOf(progress, s.now_ms)) {
      JsonObject row;
      row.add("rank", r.rank).add("group", r.group);
      if (r.named()) {
        row.add("seq", r.seq).add("op", r.op).add("age_s", r.age_s);
      } else {
        row.addNull("seq").addNull("op").addNull("age_s");
      }
      row.add("state", r.state).add("source", r.source);
      rows.push_back(std::move(row));
    }
    o.add("trace", rows);
  }
  return o.str() + "\n";
}

std::string formatProgressTable(const JobStatus& s, const JobProgress& progress, bool trace) {
  if (s.round < 0 || s.round_state == "forming") return {};
  if (progress.nodes.empty()) {
    return "no collective progress published in this round (workers without a flight recorder, or none yet)\n";
  }
  std::string out = "\n";
  if (trace) {
    std::vector<std::vector<std::string>> rows = {{"RANK", "GROUP", "SEQ", "OP", "STATE", "AGE", "SOURCE"}};
    for (const TraceRow& r : traceOf(progress, s.now_ms)) {
      rows.push_back({std::to_string(r.rank), std::to_string(r.group), r.named() ? "#" + std::to_string(r.seq) : "-",
                      r.op, r.state, r.named() ? fmt::format("{:.1f}s", r.age_s) : "-", r.source});
    }
    return out + alignedRows(rows);
  }
  const JobLags lags = lagsOf(progress);
  if (lags.lags.empty()) {
    return out + "no rank judged yet: a rank needs " + std::to_string(agent::kStragglerMinCollectives) +
           " completed collectives, and a group 2 such ranks\n";
  }
  std::vector<std::vector<std::string>> rows = {{"RANK", "GROUP", "LAG", "MEAN WAIT", "COLLECTIVES", "LAST"}};
  std::vector<int> named;
  for (const agent::RankLag& l : lags.lags) {
    const bool straggler = straggles(l, lags.threshold_s);
    if (straggler) named.push_back(l.rank);
    rows.push_back({std::to_string(l.rank), std::to_string(l.group),
                    fmt::format("{:.3f}s{}", l.lag_s, straggler ? " straggler" : ""),
                    fmt::format("{:.3f}s", l.mean_wait_s), std::to_string(l.collectives),
                    "#" + std::to_string(l.last_completed_seq)});
  }
  out += alignedRows(rows);
  out += fmt::format("lag: how far behind its group's median rank a rank enters collectives (as of {})\n",
                     ago(lags.oldest_ms, s.now_ms));
  if (lags.threshold_s <= 0) {
    out += "stragglers: not judged (--straggler_threshold 0)\n";
  } else if (named.empty()) {
    out += fmt::format("stragglers: none (threshold {:.3f}s)\n", lags.threshold_s);
  } else {
    out += fmt::format("stragglers: rank {} (threshold {:.3f}s)\n", agent::rankRanges(named), lags.threshold_s);
  }
  return out;
}

JobProgress readJobProgress(rendezvous::Store& store, const JobStatus& status) {
  JobProgress out;
  if (status.round < 0) return out;
  int participants = status.nodes_in_round;
  for (const AgentRecord& a : status.agents) {
    if (a.round == status.round) participants = std::max(participants, a.group_rank + 1);
  }
  // Ranks must lie within the world; before it is known, within what a store value can name.
  const int world = status.world_size > 0 ? status.world_size : 1 << 24;
  for (auto& [g, value] :
       rendezvous::readRoundProgress(store, "rdzv/" + status.run_id + "/", status.round, participants,
                                     agent::kMaxProgressBytes, kMaxStatusProgressBytes)) {
    auto decoded = agent::decodeNodeProgress(value, world);
    if (!decoded) {
      ++out.rejected;
      continue;
    }
    out.rejected += decoded->rejected;
    out.nodes.push_back(JobProgress::Node{g, std::move(decoded->progress)});
  }
  return out;
}

std::string newestEventsFile(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw UsageError("status: --log_dir " + dir + " is not a directory");
  // The directory itself may be a run directory, or the --log_dir holding several.
  std::optional<fs::path> newest;
  fs::file_time_type newest_time;
  auto consider = [&](const fs::path& file) {
    auto time = fs::last_write_time(file, ec);
    if (ec) return;
    if (!newest || time > newest_time) {
      newest = file;
      newest_time = time;
    }
  };
  if (fs::exists(fs::path(dir) / agent::kEventsFileName, ec)) consider(fs::path(dir) / agent::kEventsFileName);
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const fs::path file = entry.path() / agent::kEventsFileName;
    if (entry.is_directory(ec) && fs::exists(file, ec)) consider(file);
  }
  if (!newest) {
    throw UsageError("status: no " + std::string(agent::kEventsFileName) + " in " + dir +
                     " or its run directories (was the job started with --log_dir?)");
  }
  return newest->string();
}

std::optional<std::string> lastHangVerdict(const std::string& events_file) {
  std::ifstream in(events_file);
  std::string line;
  std::optional<std::string> last;
  while (std::getline(in, line)) {
    if (stringField(line, "event") != "hang_verdict") continue;
    auto verdict = stringField(line, "verdict");
    if (!verdict) continue;
    // "attempt" is a number: read it as the text up to the next comma or brace.
    std::string attempt = "?";
    if (auto at = line.find("\"attempt\":"); at != std::string::npos) {
      attempt = line.substr(at + 10, line.find_first_of(",}", at + 10) - (at + 10));
    }
    last = "attempt " + attempt + ": " + *verdict;
  }
  return last;
}

JobLocation locateJobFromLogDir(const std::string& dir) {
  const fs::path newest = newestEventsFile(dir);
  std::ifstream in(newest);
  std::string line;
  while (std::getline(in, line)) {
    if (stringField(line, "event") != "agent_start") continue;
    auto store = stringField(line, "store");
    auto run_id = stringField(line, "run_id");
    if (store && run_id) return {*store, *run_id};
  }
  throw UsageError("status: " + newest.string() + " has no agent_start event");
}

namespace {

int printStatus(const JobStatus& status, const JobProgress& progress, bool json, bool trace,
                const std::string& log_dir) {
  std::string text = json ? formatStatusJson(status, progress, trace)
                          : formatStatusTable(status) + formatProgressTable(status, progress, trace);
  if (!json && !log_dir.empty()) {
    // A worker's words can be part of a verdict (its stack's source line).
    if (auto verdict = lastHangVerdict(newestEventsFile(log_dir)))
      text += "last hang verdict: " + printable(*verdict) + "\n";
  }
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

// --rdzv_conf as the job's agents read it (launcher/rdzv_conf.h), so the job's own value can be
// given as it is; keys without effect for the backend are warned about, as the launcher does.
std::map<std::string, std::string> statusConf(const std::string& backend, const std::string& text) {
  try {
    RdzvConf conf = rdzvConfForBackend(backend, splitRdzvConf(text));
    for (const std::string& warning : conf.warnings) logger("launcher")->warn("status: {}", warning);
    return std::move(conf.conf);
  } catch (const UsageError& e) {
    throw UsageError(std::string("status: ") + e.what());
  }
}

// The job's records on etcd (rendezvous/etcd/etcd_backend.h), with --rdzv_conf's etcd keys, and
// its progress into `progress`.
JobStatus etcdJobStatus(JobProgress& progress, const std::string& endpoint, const std::string& run_id,
                        const std::string& backend, const std::string& conf) {
  rendezvous::RendezvousConfig config;
  config.backend = "etcd-v2";
  config.endpoint = endpoint;
  config.run_id = run_id;
  config.conf = statusConf(backend, conf);
  rendezvous::StoreClientOptions options;
  options.connect_timeout = kConnectTimeout;
  options.timeout = kOperationTimeout;
  JobStatus status;
  try {
    auto store = rendezvous::connectToJob(config, options);
    status = rendezvous::readJobStatus(*store, run_id);
    progress = readJobProgress(*store, status);
  } catch (const rendezvous::StoreError& e) {
    throw RendezvousError("status of job '" + run_id + "': " + e.what());
  }
  status.store = "etcd " + endpoint;
  return status;
}

}  // namespace

int runStatusCommand(int argc, const char* const* argv) {
  CLI::App app{"ddprun status: nodes, ranks, round, restarts and heartbeats of a running job.", "ddprun status"};
  std::string endpoint;
  std::string run_id;
  std::string log_dir;
  std::string conf;
  std::string backend = "c10d";
  bool json = false;
  bool stacks = false;
  bool trace = false;
  app.add_option("--rdzv_endpoint,--rdzv-endpoint", endpoint, "The job's rendezvous store, host:port.");
  app.add_option("--rdzv_id,--rdzv-id", run_id, "The job id.");
  app.add_option("--log_dir,--log-dir", log_dir, "Find the store and job id in the events file an agent wrote here.");
  app.add_option("--rdzv_conf,--rdzv-conf", conf,
                 "token_file=PATH when the store needs a token (or DDPRUN_TOKEN); etcd: protocol, cacert, cert, key, "
                 "key_prefix.");
  app.add_option("--rdzv_backend,--rdzv-backend", backend,
                 "c10d (or static): the agents' store; etcd-v2: --rdzv_endpoint lists etcd's members.");
  app.add_flag("--json", json, "One JSON object instead of the table.");
  app.add_flag("--stacks", stacks,
               "Instead: every thread's native stack of this host's running workers (with --log_dir), without "
               "stopping them.");
  app.add_flag("--trace", trace,
               "Every rank's current collective (group, sequence number, op, state, age) instead of the lags.");
  if (!parseSubcommandArgs(app, argc, argv, "status")) return 0;
  if (stacks && trace) throw UsageError("status: --stacks and --trace are two views: give one");
  if (stacks) {
    if (log_dir.empty())
      throw UsageError("status --stacks needs --log_dir DIR: the agent's events file there names its workers");
    if (json) throw UsageError("status --stacks prints stacks, not JSON: leave out --json");
    return printWorkerStacks(newestEventsFile(log_dir));
  }
  if (!log_dir.empty() && (endpoint.empty() || run_id.empty())) {
    JobLocation found = locateJobFromLogDir(log_dir);
    if (endpoint.empty()) endpoint = found.endpoint;
    if (run_id.empty()) run_id = found.run_id;
  }
  if (endpoint.empty() || run_id.empty()) {
    throw UsageError("status: needs --rdzv_endpoint host:port and --rdzv_id ID, or --log_dir DIR");
  }
  // An agent's events file names etcd's members as "etcd a:2379,b:2379".
  if (endpoint.rfind("etcd ", 0) == 0) {
    endpoint = endpoint.substr(5);
    backend = "etcd-v2";
  }
  JobProgress progress;
  if (rendezvous::etcd::isEtcdBackend(backend)) {
    const JobStatus status = etcdJobStatus(progress, endpoint, run_id, backend, conf);
    return printStatus(status, progress, json, trace, log_dir);
  }
  // Of the store's settings, status needs only the token; its own timeouts bound each look.
  const std::map<std::string, std::string> settings = statusConf(backend, conf);
  const auto token = settings.find("token_file");
  const std::string token_file = token == settings.end() ? "" : token->second;
  rendezvous::RendezvousConfig config;
  config.backend = backend;
  config.endpoint = endpoint;
  config.run_id = run_id;
  if (!token_file.empty()) config.conf["token_file"] = token_file;
  rendezvous::StoreClientOptions options;
  options.connect_timeout = kConnectTimeout;
  options.timeout = kOperationTimeout;
  JobStatus status;
  try {
    const auto store = rendezvous::connectToJob(config, options);
    status = rendezvous::readJobStatus(*store, run_id);
    progress = readJobProgress(*store, status);
  } catch (const rendezvous::StoreError& e) {
    throw RendezvousError("status of job '" + run_id + "': " + e.what());
  }
  status.store = endpoint;
  return printStatus(status, progress, json, trace, log_dir);
}

}  // namespace ddprun::launcher
