#include "agent/hang/rings/hang_verdict.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <fmt/format.h>

namespace ddprun::agent {

namespace {

double secondsBetween(int64_t from_ns, int64_t to_ns) { return std::max<double>(0, (to_ns - from_ns) / 1e9); }

// Where a rank stands, as one number: 2*seq when it has not called operation `seq` yet,
// 2*seq + 1 when it is inside it. The smallest is the one behind.
uint64_t positionKey(const RankPosition& p) {
  return p.pending ? 2 * p.pending->seq + 1 : 2 * (p.last_completed_seq + 1);
}

std::string ranksWord(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + rankRanges(ranks);
}

std::string opAt(FlightOp op, uint64_t seq) { return fmt::format("{} #{}", flightOpName(op), seq); }

std::string sizeOf(const FlightOpInfo& info) { return fmt::format("{} {}", info.count, flightDTypeName(info.dtype)); }

// What one set of ranks at the same position is doing.
std::string describe(const std::vector<int>& ranks, const RankPosition& p, bool behind) {
  const std::string who = ranksWord(ranks);
  if (!p.pending) {
    std::string last = p.last_completed_seq == 0
                           ? std::string("none completed")
                           : fmt::format("last completed {}, {:.0f} s ago",
                                         opAt(p.last_completed_op, p.last_completed_seq), p.last_completed_age_s);
    return fmt::format("{} {} not called #{} ({})", who, ranks.size() == 1 ? "has" : "have", p.last_completed_seq + 1,
                       last);
  }
  const FlightRecord& r = *p.pending;
  const char* when = r.started_ns != 0 ? "started" : "enqueued";
  if (r.state == FlightState::kFailed) {
    return fmt::format("{} failed in {}", who, opAt(r.info.op, r.seq));
  }
  if (behind) {
    return fmt::format("{} {} at {} ({} {:.0f} s ago)", who, ranks.size() == 1 ? "is" : "are", opAt(r.info.op, r.seq),
                       when, p.pending_age_s);
  }
  return fmt::format("{} {} in {} ({} {:.0f} s ago)", who, ranks.size() == 1 ? "waits" : "wait", opAt(r.info.op, r.seq),
                     when, p.pending_age_s);
}

// Ranks inside the same operation that called different things: the few against the rest.
std::optional<HangVerdict> mismatch(const std::vector<const RankPosition*>& at_seq) {
  if (at_seq.size() < 2) return std::nullopt;
  const uint64_t seq = at_seq.front()->pending->seq;
  using Key = std::tuple<int, int, uint64_t, int>;
  // Op first: a different op explains a different size too.
  for (int level = 0; level < 3; ++level) {
    auto key = [level](const FlightOpInfo& i) -> Key {
      if (level == 0) return {static_cast<int>(i.op), 0, 0, 0};
      if (level == 1) return {static_cast<int>(i.op), static_cast<int>(i.dtype), i.count, 0};
      return {static_cast<int>(i.op), static_cast<int>(i.dtype), i.count, i.root};
    };
    std::map<Key, std::vector<const RankPosition*>> by;
    for (const auto* p : at_seq) by[key(p->pending->info)].push_back(p);
    if (by.size() < 2) continue;
    // The largest set is "the others" (ties: the one holding the lowest rank).
    auto majority = by.begin();
    auto lowest = [](const std::vector<const RankPosition*>& ps) {
      int low = ps.front()->rank;
      for (const auto* p : ps) low = std::min(low, p->rank);
      return low;
    };
    for (auto it = by.begin(); it != by.end(); ++it) {
      const size_t n = it->second.size(), m = majority->second.size();
      if (n > m || (n == m && lowest(it->second) < lowest(majority->second))) majority = it;
    }
    const FlightOpInfo& want = majority->second.front()->pending->info;
    std::vector<std::string> parts;
    HangVerdict verdict;
    for (auto& [k, ps] : by) {
      if (&ps == &majority->second) continue;
      std::vector<int> ranks;
      for (const auto* p : ps) ranks.push_back(p->rank);
      verdict.culprits.insert(verdict.culprits.end(), ranks.begin(), ranks.end());
      const FlightOpInfo& got = ps.front()->pending->info;
      if (level == 0) {
        parts.push_back(fmt::format("{} called {} where the others called {} (#{})", ranksWord(ranks),
                                    flightOpName(got.op), flightOpName(want.op), seq));
      } else if (level == 1) {
        parts.push_back(fmt::format("{} called {} on {} where the others used {} (#{})", ranksWord(ranks),
                                    flightOpName(got.op), sizeOf(got), sizeOf(want), seq));
      } else {
        parts.push_back(fmt::format("{} called {} with root {} where the others used root {} (#{})", ranksWord(ranks),
                                    flightOpName(got.op), got.root, want.root, seq));
      }
    }
    for (const auto& s : parts) verdict.text += (verdict.text.empty() ? "" : "; ") + s;
    return verdict;
  }
  return std::nullopt;
}

std::optional<HangVerdict> groupVerdict(const std::vector<const RankPosition*>& ranks) {
  bool any_pending = false;
  for (const auto* p : ranks) any_pending = any_pending || p->pending.has_value();
  if (!any_pending) return std::nullopt;

  // A mismatch at some sequence number explains the hang better than who is behind.
  std::map<uint64_t, std::vector<const RankPosition*>> by_seq;
  for (const auto* p : ranks) {
    if (p->pending) by_seq[p->pending->seq].push_back(p);
  }
  for (auto& [seq, at] : by_seq) {
    if (auto m = mismatch(at)) {
      m->text = "hang: " + m->text;
      return m;
    }
  }

  std::map<uint64_t, std::vector<const RankPosition*>> by_position;
  for (const auto* p : ranks) by_position[positionKey(*p)].push_back(p);
  auto listOf = [](const std::vector<const RankPosition*>& ps) {
    std::vector<int> out;
    for (const auto* p : ps) out.push_back(p->rank);
    return out;
  };
  // The oldest age among a set of ranks at one position.
  auto eldest = [](const std::vector<const RankPosition*>& ps) {
    const RankPosition* e = ps.front();
    for (const auto* p : ps) {
      if (p->pending && p->pending_age_s > e->pending_age_s) e = p;
    }
    return e;
  };
  if (by_position.size() == 1) {
    const auto& ps = by_position.begin()->second;
    return HangVerdict{"hang: " + describe(listOf(ps), *eldest(ps), false) +
                           " — no rank here is behind (a rank elsewhere, or the network?)",
                       {}};
  }
  std::vector<std::string> parts;
  auto behind = by_position.begin();
  parts.push_back(describe(listOf(behind->second), *eldest(behind->second), true));
  for (auto it = std::next(behind); it != by_position.end(); ++it) {
    parts.push_back(describe(listOf(it->second), *eldest(it->second), false));
  }
  std::string out = "hang: ";
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "; " : "") + parts[i];
  const auto behind_ranks = listOf(behind->second);
  out += fmt::format(" — {} {} behind", ranksWord(behind_ranks), behind_ranks.size() == 1 ? "is" : "are");
  return HangVerdict{out, behind_ranks};
}

// The peer of a message, named by its global rank when the group's positions say it (or
// in the default group, where group and global ranks are one), else by its group rank.
struct Peer {
  int rank = -1;  // global; -1: not known
  std::string name;
  const RankPosition* messages = nullptr;
  const RankPosition* collectives = nullptr;
};

const RankPosition* atGroupRank(const std::vector<const RankPosition*>& ps, int group_rank) {
  for (const auto* p : ps) {
    if (p->group_rank == group_rank) return p;
  }
  return nullptr;
}

// One line over a group's messages: where each rank with one pending waits, and for whom.
std::optional<HangVerdict> messageVerdict(int group, const std::vector<const RankPosition*>& messages,
                                          const std::vector<const RankPosition*>& collectives) {
  std::vector<std::string> parts;
  HangVerdict verdict;
  for (const auto* p : messages) {
    if (!p->pending) continue;
    const FlightRecord& r = *p->pending;
    Peer peer;
    peer.messages = atGroupRank(messages, r.info.root);
    peer.collectives = atGroupRank(collectives, r.info.root);
    if (peer.messages) {
      peer.rank = peer.messages->rank;
    } else if (peer.collectives) {
      peer.rank = peer.collectives->rank;
    } else if (group == 0) {
      peer.rank = r.info.root;
    }
    peer.name = peer.rank >= 0 ? fmt::format("rank {}", peer.rank) : fmt::format("group rank {}", r.info.root);
    const std::string direction = r.info.op == FlightOp::kSend ? "send to" : "recv from";
    std::string part = r.state == FlightState::kFailed
                           ? fmt::format("rank {} failed in {} {} (#{})", p->rank, direction, peer.name, r.seq)
                           : fmt::format("rank {} waits in {} {} (#{}, {} {:.0f} s ago)", p->rank, direction, peer.name,
                                         r.seq, r.started_ns != 0 ? "started" : "enqueued", p->pending_age_s);
    auto blame = [&] {
      part += fmt::format(" — {} is behind", peer.name);
      if (peer.rank >= 0) verdict.culprits.push_back(peer.rank);
    };
    if (peer.messages && peer.messages->pending) {
      // The peer waits in a message of its own: its part says where.
    } else if (peer.collectives && peer.collectives->pending) {
      const RankPosition& c = *peer.collectives;
      const FlightRecord& in = *c.pending;
      const RankPosition* mine = atGroupRank(collectives, p->group_rank);
      if (in.state == FlightState::kFailed) {
        part += fmt::format(" while {} failed in {}", peer.name, opAt(in.info.op, in.seq));
      } else if (mine && positionKey(*mine) < positionKey(c)) {
        part += fmt::format(
            " while {} waits in {} ({} {:.0f} s ago), which rank {} has not called — they wait for "
            "each other",
            peer.name, opAt(in.info.op, in.seq), in.started_ns != 0 ? "started" : "enqueued", c.pending_age_s, p->rank);
      } else {
        part += fmt::format(" while {} is in {} ({} {:.0f} s ago)", peer.name, opAt(in.info.op, in.seq),
                            in.started_ns != 0 ? "started" : "enqueued", c.pending_age_s);
        blame();
      }
    } else if (peer.messages || peer.collectives) {
      part += fmt::format(" while {} has no operation pending", peer.name);
      blame();
    } else {
      part += fmt::format(" while nothing is known of {}", peer.name);
    }
    parts.push_back(std::move(part));
  }
  if (parts.empty()) return std::nullopt;
  verdict.text = "hang: ";
  for (size_t i = 0; i < parts.size(); ++i) verdict.text += (i ? "; " : "") + parts[i];
  return verdict;
}

bool parseInt(const std::string& token, auto& value) {
  const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  return ec == std::errc() && end == token.data() + token.size();
}

bool parseSeconds(const std::string& token, double& value) {
  const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  return ec == std::errc() && end == token.data() + token.size() && std::isfinite(value);
}

bool validOp(int op) { return op >= 0 && op <= static_cast<int>(FlightOp::kRecv); }
bool validDType(int dtype) {
  return (dtype >= 0 && dtype <= static_cast<int>(FlightDType::kUInt8)) ||
         dtype == static_cast<int>(FlightDType::kNone);
}
bool validState(int state) { return state >= 0 && state <= static_cast<int>(FlightState::kFailed); }

}  // namespace

RankPosition positionOf(const FlightRingSnapshot& ring, int64_t now_ns) {
  RankPosition p;
  p.kind = ring.kind;
  p.rank = ring.rank;
  p.group = ring.group;
  p.group_rank = ring.group_rank;
  if (ring.kind == FlightRingKind::kPointToPoint) {
    // Messages to different peers complete in any order: progress is the latest completion,
    // and the oldest message still moving is where the rank waits.
    const FlightRecord* last = nullptr;
    const FlightRecord* waiting = nullptr;
    const FlightRecord* failed = nullptr;
    auto later = [](const FlightRecord& a, const FlightRecord* b) {
      return !b || a.ended_ns > b->ended_ns || (a.ended_ns == b->ended_ns && a.seq > b->seq);
    };
    for (const auto& r : ring.records) {
      if (r.state == FlightState::kCompleted) {
        if (later(r, last)) last = &r;
      } else if (r.state == FlightState::kFailed) {
        failed = &r;
      } else if (!waiting) {
        waiting = &r;
      }
    }
    if (last) {
      p.last_completed_seq = last->seq;
      p.last_completed_op = last->info.op;
      p.last_completed_age_s = secondsBetween(last->ended_ns, now_ns);
    }
    // A failure is where the rank stands until it completes a message after it.
    if (!waiting && failed && later(*failed, last)) waiting = failed;
    if (waiting) {
      p.pending = *waiting;
      p.pending_age_s = secondsBetween(waiting->started_ns != 0 ? waiting->started_ns : waiting->enqueued_ns, now_ns);
    }
    return p;
  }
  for (const auto& r : ring.records) {
    if (r.state == FlightState::kCompleted && r.seq > p.last_completed_seq) {
      p.last_completed_seq = r.seq;
      p.last_completed_op = r.info.op;
      p.last_completed_age_s = secondsBetween(r.ended_ns, now_ns);
    }
  }
  // Operations of a group run in order: the first one after the last completed is where it is.
  for (const auto& r : ring.records) {
    if (r.seq > p.last_completed_seq && r.state != FlightState::kCompleted) {
      p.pending = r;
      p.pending_age_s = secondsBetween(r.started_ns != 0 ? r.started_ns : r.enqueued_ns, now_ns);
      break;
    }
  }
  return p;
}

bool noProgressFor(const std::vector<RankPosition>& ranks, double timeout_s) {
  double oldest_pending = -1;
  double since_progress = std::numeric_limits<double>::infinity();
  for (const auto& p : ranks) {
    if (p.pending) oldest_pending = std::max(oldest_pending, p.pending_age_s);
    if (p.last_completed_age_s >= 0) {
      since_progress = std::min(since_progress, p.last_completed_age_s);
    } else if (p.pending) {
      since_progress = std::min(since_progress, p.pending_age_s);
    }
  }
  // The wait itself must have lasted the timeout: ranks that computed (or wrote a checkpoint)
  // for longer than it with nothing pending, then waited a shorter while, are not hung.
  return oldest_pending >= timeout_s && since_progress >= timeout_s;
}

std::optional<HangVerdict> hangVerdict(const std::vector<RankPosition>& ranks) {
  struct Group {
    std::vector<const RankPosition*> collectives;
    std::vector<const RankPosition*> messages;
  };
  std::map<int, Group> by_group;
  for (const auto& p : ranks) {
    Group& g = by_group[p.group];
    (p.kind == FlightRingKind::kPointToPoint ? g.messages : g.collectives).push_back(&p);
  }
  auto byRank = [](const auto* a, const auto* b) { return a->rank < b->rank; };
  HangVerdict out;
  auto add = [&](int group, std::optional<HangVerdict> v) {
    if (!v) return;
    if (group != 0) v->text += fmt::format(" (group {})", group);
    out.text += (out.text.empty() ? "" : "\n") + v->text;
    out.culprits.insert(out.culprits.end(), v->culprits.begin(), v->culprits.end());
  };
  for (auto& [group, g] : by_group) {
    std::sort(g.collectives.begin(), g.collectives.end(), byRank);
    std::sort(g.messages.begin(), g.messages.end(), byRank);
    add(group, groupVerdict(g.collectives));
    add(group, messageVerdict(group, g.messages, g.collectives));
  }
  if (out.text.empty()) return std::nullopt;
  std::sort(out.culprits.begin(), out.culprits.end());
  out.culprits.erase(std::unique(out.culprits.begin(), out.culprits.end()), out.culprits.end());
  return out;
}

bool reportsCollectiveTimeout(std::string_view message) {
  std::string lower(message);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find("timed out") != std::string::npos ||
         lower.find("collective operation timeout") != std::string::npos;
}

std::string rankRanges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string encodePosition(const RankPosition& p) {
  std::string out =
      fmt::format("v2 {} {} {} {} {} {} {:.3f}", p.kind == FlightRingKind::kPointToPoint ? "p" : "c", p.rank, p.group,
                  p.group_rank, p.last_completed_seq, static_cast<int>(p.last_completed_op), p.last_completed_age_s);
  if (p.pending) {
    const FlightRecord& r = *p.pending;
    out +=
        fmt::format(" {} {} {} {} {} {} {} {:.3f}", r.seq, static_cast<int>(r.info.op), static_cast<int>(r.info.dtype),
                    r.info.count, r.info.root, static_cast<int>(r.state), r.started_ns != 0 ? 1 : 0, p.pending_age_s);
  }
  return out;
}

std::optional<RankPosition> decodePosition(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> t;
  for (std::string token; in >> token;) t.push_back(token);
  // Exactly an idle position or one with its pending operation: anything else is another version or garbage.
  if ((t.size() != 8 && t.size() != 16) || t[0] != "v2" || (t[1] != "c" && t[1] != "p")) return std::nullopt;
  RankPosition p;
  p.kind = t[1] == "p" ? FlightRingKind::kPointToPoint : FlightRingKind::kCollective;
  int op = 0;
  if (!parseInt(t[2], p.rank) || !parseInt(t[3], p.group) || !parseInt(t[4], p.group_rank) ||
      !parseInt(t[5], p.last_completed_seq) || !parseInt(t[6], op) || !validOp(op) ||
      !parseSeconds(t[7], p.last_completed_age_s)) {
    return std::nullopt;
  }
  p.last_completed_op = static_cast<FlightOp>(op);
  if (t.size() == 8) return p;
  FlightRecord r;
  int dtype = 0, state = 0, started = 0;
  if (!parseInt(t[8], r.seq) || !parseInt(t[9], op) || !validOp(op) || !parseInt(t[10], dtype) || !validDType(dtype) ||
      !parseInt(t[11], r.info.count) || !parseInt(t[12], r.info.root) || !parseInt(t[13], state) ||
      !validState(state) || !parseInt(t[14], started) || (started != 0 && started != 1) ||
      !parseSeconds(t[15], p.pending_age_s)) {
    return std::nullopt;
  }
  r.info.op = static_cast<FlightOp>(op);
  r.info.dtype = static_cast<FlightDType>(dtype);
  r.state = static_cast<FlightState>(state);
  // Only whether it started matters once it has crossed hosts.
  r.started_ns = started;
  p.pending = r;
  return p;
}

SummaryPositions decodeSummary(std::string_view summary, int world_size, const std::vector<int>& local_ranks) {
  SummaryPositions out;
  std::set<std::tuple<FlightRingKind, int, int>> seen;
  while (!summary.empty()) {
    const size_t newline = summary.find('\n');
    const std::string_view line = summary.substr(0, newline);
    summary = newline == std::string_view::npos ? std::string_view{} : summary.substr(newline + 1);
    // Lines of other kinds are read elsewhere: torch's dumps ("fr1 ...", agent/torch_trace/dump_summary.h)
    // and Python tracebacks ("py1 ...", agent/hang/python/stack_summary.h).
    if (line.empty() || line.substr(0, 2) == "fr" || line.substr(0, 2) == "py") continue;
    const std::optional<RankPosition> p = decodePosition(std::string(line));
    const bool fits = p && p->rank >= 0 && p->rank < world_size && p->group_rank >= 0 && p->group_rank < world_size &&
                      p->group >= 0 &&
                      std::find(local_ranks.begin(), local_ranks.end(), p->rank) == local_ranks.end() &&
                      out.positions.size() < kMaxSummaryPositions && seen.emplace(p->kind, p->group, p->rank).second;
    if (fits) {
      out.positions.push_back(*p);
    } else {
      ++out.rejected;
    }
  }
  return out;
}

}  // namespace ddprun::agent
