#include "agent/hang/python/live_positions.h"

#include <algorithm>
#include <charconv>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "agent/hang/python/live_trace.h"
#include "common/logging.h"
#include "common/text_escape.h"

namespace ddprun::agent {
namespace {

// The group a row names: torch's group name where it is a number (torch names its groups by a
// counter, "0" the default one, as ddprun's rings number theirs), else the recorder's group id
// (a hashed name); -1 when neither is there.
int groupOf(const FlightEntry& e) {
  int name = -1;
  const char* end = e.pg_name.data() + e.pg_name.size();
  const auto [at, ec] = std::from_chars(e.pg_name.data(), end, name);
  if (!e.pg_name.empty() && ec == std::errc() && at == end && name >= 0) return name;
  return e.pg_id >= 0 && e.pg_id <= INT32_MAX ? static_cast<int>(e.pg_id) : -1;
}

double secondsSince(int64_t then_ns, int64_t now_ns) {
  // An entry without its time (0), or stamped after the reading, is no older than the reading.
  if (then_ns <= 0 || then_ns > now_ns) return 0;
  return static_cast<double>(now_ns - then_ns) / 1e9;
}

struct GroupEntries {
  const FlightEntry* oldest_pending = nullptr;
  const FlightEntry* last_completed = nullptr;
};

}  // namespace

std::vector<TracePosition> tracePositions(const FlightDump& dump, int64_t now_unix_ns) {
  std::map<int, GroupEntries> groups;
  for (const FlightEntry& e : dump.entries) {
    const int group = groupOf(e);
    if (e.is_p2p || group < 0) continue;
    GroupEntries& g = groups[group];
    if (e.state == FlightEntryState::kCompleted) {
      g.last_completed = &e;
    } else if (g.oldest_pending == nullptr) {
      g.oldest_pending = &e;
    }
  }
  std::vector<TracePosition> rows;
  for (const auto& [group, g] : groups) {
    TracePosition row;
    row.rank = dump.rank;
    row.group = group;
    if (g.oldest_pending != nullptr) {
      const FlightEntry* e = g.oldest_pending;
      const bool started = e->state == FlightEntryState::kStarted || e->time_started_ns.has_value();
      const bool timed_out =
          e->timeout_ms > 0 && e->time_created_ns > 0 && now_unix_ns - e->time_created_ns > e->timeout_ms * 1000000;
      row.state = timed_out ? TraceState::kFailed : started ? TraceState::kStarted : TraceState::kPending;
      row.seq = static_cast<uint64_t>(std::max<int64_t>(0, e->collective_seq_id));
      row.op = traceOpName(e->op);
      row.age_s = secondsSince(e->time_started_ns.value_or(e->time_created_ns), now_unix_ns);
    } else {
      const FlightEntry* e = g.last_completed;
      row.state = TraceState::kCompleted;
      row.seq = static_cast<uint64_t>(std::max<int64_t>(0, e->collective_seq_id));
      row.op = traceOpName(e->op);
      row.age_s = secondsSince(e->time_completed_ns.value_or(e->time_created_ns), now_unix_ns);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<std::string> periodicTraceHandlers(const std::vector<std::string>& listed) {
  auto has = [&](const char* name) { return std::find(listed.begin(), listed.end(), name) != listed.end(); };
  std::vector<std::string> out;
  for (const char* json : {"fr_trace_json", "dump_nccl_trace_json"}) {
    if (has(json)) out.emplace_back(json);
  }
  if (out.empty() && has("dump_nccl_trace_pickle")) out.emplace_back("dump_nccl_trace_pickle");
  return out;
}

LiveTraceReader::LiveTraceReader(WorkerServerLimits limits) : limits_(limits) {}

LiveTraceReader::~LiveTraceReader() = default;  // each future waits for its read: bounded by the limits

LiveTraceReader::Read LiveTraceReader::readOnce(const std::string& socket, int rank,
                                                std::optional<std::vector<std::string>> handlers,
                                                const WorkerServerLimits& limits) {
  Read out;
  if (!handlers) {
    const WorkerServerReply listing = askWorkerServer(socket, "GET", "/handler/", limits);
    if (!listing.ok()) {
      out.problem = listing.problem;
      return out;
    }
    const auto names = parseHandlerNames(listing.body);
    if (!names) {
      out.problem = fmt::format("torch's worker server {}: GET /handler/ gave no list of names", printable(socket));
      return out;
    }
    out.listed = periodicTraceHandlers(*names);
    handlers = out.listed;
  }
  for (const std::string& handler : *handlers) {
    const WorkerServerReply reply = askWorkerServer(socket, "POST", "/handler/" + handler, limits);
    if (!reply.ok()) {
      out.problem = reply.problem;
      continue;
    }
    try {
      out.traces.push_back(
          parseLiveTrace(handler, reply.body, fmt::format("{} ({})", printable(socket), handler), rank));
    } catch (const FlightDumpError& e) {
      out.problem = e.what();
    }
  }
  // One handler's trace is enough to show the rank: another's failure is not worth a word.
  if (!out.traces.empty()) out.problem.clear();
  return out;
}

void LiveTraceReader::start(const std::vector<Source>& sources) {
  std::erase_if(forgotten_,
                [](std::future<Read>& f) { return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready; });
  for (auto& [pid, w] : workers_) w.fresh = false;
  for (const Source& s : sources) {
    Worker& w = workers_[s.pid];
    w.rank = s.rank;
    if (w.handlers && w.handlers->empty()) continue;  // listed, no trace handler: never asked again
    if (w.read.valid()) continue;                     // still reading, or read and not taken
    std::string socket = existingWorkerServerSocket(s.dir, s.pid);
    if (socket.empty()) continue;  // no server (torch before 2.4, DDPRUN_WORKER_SERVER=0), or not yet
    w.read = std::async(std::launch::async, [socket = std::move(socket), rank = s.rank, handlers = w.handlers,
                                             limits = limits_] { return readOnce(socket, rank, handlers, limits); });
    w.fresh = true;
  }
}

bool LiveTraceReader::busy() {
  return std::any_of(workers_.begin(), workers_.end(), [](auto& entry) {
    Worker& w = entry.second;
    return w.fresh && w.read.valid() && w.read.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
  });
}

bool LiveTraceReader::waitIdle(std::chrono::milliseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  for (auto& [pid, w] : workers_) {
    if (w.fresh && w.read.valid() && w.read.wait_until(deadline) != std::future_status::ready) return false;
  }
  return true;
}

std::vector<TracePosition> LiveTraceReader::take(int64_t now_unix_ns) {
  std::vector<TracePosition> rows;
  for (auto& [pid, w] : workers_) {
    if (!w.read.valid() || w.read.wait_for(std::chrono::seconds(0)) != std::future_status::ready) continue;
    Read read = w.read.get();
    if (read.listed) w.handlers = std::move(read.listed);
    std::set<int> groups;
    for (const FlightDump& trace : read.traces) {
      // A group in two handlers' traces (NCCL's recorder in both, some builds) shows once.
      for (TracePosition& row : tracePositions(trace, now_unix_ns)) {
        if (groups.insert(row.group).second) rows.push_back(std::move(row));
      }
    }
    if (!read.problem.empty() && !w.warned) {
      w.warned = true;
      logger("agent")->warn("{}; `ddprun status --trace` shows rank {} from ddprun's rings", read.problem, w.rank);
    }
  }
  std::sort(rows.begin(), rows.end(), [](const TracePosition& a, const TracePosition& b) {
    return std::pair(a.rank, a.group) < std::pair(b.rank, b.group);
  });
  return rows;
}

void LiveTraceReader::forget() {
  for (auto& [pid, w] : workers_) {
    if (w.read.valid()) forgotten_.push_back(std::move(w.read));
  }
  workers_.clear();
}

}  // namespace ddprun::agent
