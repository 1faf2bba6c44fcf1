#include "rendezvous/board/job_status.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "rendezvous/rounds/round_end.h"

namespace ddprun::rendezvous {
namespace {

constexpr const char* kVersion = "v2";
constexpr size_t kFields = 17;
// An agent of before the generations field: the same record, one field shorter.
constexpr const char* kVersionV1 = "v1";
constexpr size_t kFieldsV1 = 16;

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    size_t at = text.find(sep, start);
    parts.push_back(text.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return parts;
    start = at + 1;
  }
}

// A store value as an error message may quote it: printable ASCII, the rest as \xNN, at
// most 80 bytes. Anyone who can reach the store can write one, newlines and escapes included.
std::string shown(std::string_view text) {
  std::string out;
  for (unsigned char c : text.substr(0, 80))
    out += c >= 0x20 && c < 0x7f ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
  if (text.size() > 80) out += "...";
  return out;
}

int64_t toInt(const std::string& text, const std::string& record) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw RendezvousError("malformed agent record '" + shown(record) + "': '" + shown(text) + "' is not a number");
  }
  return value;
}

}  // namespace

int64_t wallClockMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string encodeAgentRecord(const AgentRecord& r) {
  return fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", kVersion, r.node, r.address, r.state,
                     r.round, r.group_rank, r.rank_base, r.nproc, r.restarts, r.max_restarts, r.heartbeat_ms,
                     r.keep_alive_ms, r.keep_alive_max_attempt, r.consecutive_failures, r.cooldown_until_ms,
                     r.exit_code, fmt::join(r.generations, ","));
}

AgentRecord decodeAgentRecord(const std::string& text) {
  auto f = split(text, '|');
  const bool v1 = f.size() == kFieldsV1 && f[0] == kVersionV1;
  if (!v1 && (f.size() != kFields || f[0] != kVersion)) {
    throw RendezvousError("malformed agent record '" + shown(text) + "' (written by another ddprun version?)");
  }
  AgentRecord r;
  r.node = f[1];
  r.address = f[2];
  r.state = f[3];
  auto num = [&](size_t i) { return toInt(f[i], text); };
  r.round = static_cast<int>(num(4));
  r.group_rank = static_cast<int>(num(5));
  r.rank_base = static_cast<int>(num(6));
  r.nproc = static_cast<int>(num(7));
  r.restarts = static_cast<int>(num(8));
  r.max_restarts = static_cast<int>(num(9));
  r.heartbeat_ms = num(10);
  r.keep_alive_ms = num(11);
  r.keep_alive_max_attempt = static_cast<int>(num(12));
  r.consecutive_failures = static_cast<int>(num(13));
  r.cooldown_until_ms = num(14);
  r.exit_code = static_cast<int>(num(15));
  if (!v1 && !f[16].empty()) {
    for (const std::string& g : split(f[16], ',')) r.generations.push_back(static_cast<int>(toInt(g, text)));
  }
  return r;
}

bool agentLost(const AgentRecord& record, int64_t now_ms) {
  if (record.state == "exited") return false;
  const int64_t allowed = record.keep_alive_ms * (record.keep_alive_max_attempt + 1);
  return now_ms - record.heartbeat_ms > allowed;
}

JobStatus readJobStatus(Store& store, const std::string& run_id) {
  const std::string prefix = "rdzv/" + run_id + "/";
  // GET waits for a missing key, so every optional key is CHECKed first.
  auto maybeGet = [&](const std::string& key) -> std::optional<std::string> {
    if (!store.check({prefix + key})) return std::nullopt;
    return store.get(prefix + key);
  };
  JobStatus status;
  status.run_id = run_id;
  auto names = maybeGet(agentsListKey());
  if (!names) throw RendezvousError("no agent of job '" + run_id + "' has reported to this store");
  std::vector<std::string> keys;
  std::vector<std::string> seen;
  for (const std::string& name : split(*names, '\n')) {
    if (name.empty() || std::find(seen.begin(), seen.end(), name) != seen.end()) continue;
    seen.push_back(name);
    keys.push_back(prefix + agentRecordKey(name));
  }
  for (const std::string& value : store.multiGet(keys)) {
    status.agents.push_back(decodeAgentRecord(value));
    status.max_restarts = std::max(status.max_restarts, status.agents.back().max_restarts);
  }
  if (auto round = maybeGet("round")) {
    status.round = static_cast<int>(toInt(*round, *round));
    const std::string r = "r" + std::to_string(status.round) + "/";
    if (auto closed = maybeGet(r + "closed")) {
      const int64_t ticket = toInt(*closed, *closed);
      status.nodes_in_round = static_cast<int>(ticket >> 32);
      status.world_size = static_cast<int>(ticket & 0xffffffff);
      status.round_state = "running";
    } else {
      // The static backend has no `closed` key: the round runs once its agents say so.
      for (const AgentRecord& a : status.agents) {
        if (a.round != status.round || (a.state != "running" && a.state != "succeeded")) continue;
        ++status.nodes_in_round;
        status.world_size += a.nproc;
      }
      status.round_state = status.nodes_in_round > 0 ? "running" : "forming";
    }
    if (auto restarts = maybeGet(r + "restarts")) {
      status.restarts = static_cast<int>(toInt(*restarts, *restarts));
    } else if (status.round > 0) {
      // The round is forming: its count is the previous one's, plus one if that ended in a failure.
      const std::string p = "r" + std::to_string(status.round - 1) + "/";
      if (auto previous = maybeGet(p + "restarts")) {
        const auto text = maybeGet(p + "end");
        const auto end = text ? RoundEnd::parse(*text) : std::nullopt;
        status.restarts = static_cast<int>(toInt(*previous, *previous)) + (end && end->usesRestart() ? 1 : 0);
      }
    }
    if (auto end = maybeGet(r + "end")) {
      status.round_state = "ended";
      status.end_reason = *end;
    }
  }
  // The current round's nodes in group-rank order first, then the others as they came.
  std::stable_sort(status.agents.begin(), status.agents.end(), [&](const AgentRecord& a, const AgentRecord& b) {
    const bool a_now = a.round == status.round && status.round >= 0;
    const bool b_now = b.round == status.round && status.round >= 0;
    if (a_now != b_now) return a_now;
    return a_now && a.group_rank < b.group_rank;
  });
  status.now_ms = wallClockMillis();
  return status;
}

}  // namespace ddprun::rendezvous
