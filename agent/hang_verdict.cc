#include "agent/hang_verdict.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
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

}  // namespace

RankPosition positionOf(const FlightRingSnapshot& ring, int64_t now_ns) {
  RankPosition p;
  p.rank = ring.rank;
  p.group = ring.group;
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
  bool any_pending = false;
  double since_progress = std::numeric_limits<double>::infinity();
  for (const auto& p : ranks) {
    any_pending = any_pending || p.pending.has_value();
    if (p.last_completed_age_s >= 0) {
      since_progress = std::min(since_progress, p.last_completed_age_s);
    } else if (p.pending) {
      since_progress = std::min(since_progress, p.pending_age_s);
    }
  }
  return any_pending && since_progress >= timeout_s;
}

std::optional<HangVerdict> hangVerdict(const std::vector<RankPosition>& ranks) {
  std::map<int, std::vector<const RankPosition*>> by_group;
  for (const auto& p : ranks) by_group[p.group].push_back(&p);
  HangVerdict out;
  for (auto& [group, ps] : by_group) {
    std::sort(ps.begin(), ps.end(), [](const auto* a, const auto* b) { return a->rank < b->rank; });
    auto v = groupVerdict(ps);
    if (!v) continue;
    if (group != 0) v->text += fmt::format(" (group {})", group);
    out.text += (out.text.empty() ? "" : "\n") + v->text;
    out.culprits.insert(out.culprits.end(), v->culprits.begin(), v->culprits.end());
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
  std::string out = fmt::format("v1 {} {} {} {} {:.3f}", p.rank, p.group, p.last_completed_seq,
                                static_cast<int>(p.last_completed_op), p.last_completed_age_s);
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
  std::string tag;
  RankPosition p;
  int op = 0;
  if (!(in >> tag >> p.rank >> p.group >> p.last_completed_seq >> op >> p.last_completed_age_s) || tag != "v1") {
    return std::nullopt;
  }
  p.last_completed_op = static_cast<FlightOp>(op);
  FlightRecord r;
  int dtype = 0, state = 0, started = 0;
  if (in >> r.seq) {
    if (!(in >> op >> dtype >> r.info.count >> r.info.root >> state >> started >> p.pending_age_s)) {
      return std::nullopt;
    }
    r.info.op = static_cast<FlightOp>(op);
    r.info.dtype = static_cast<FlightDType>(dtype);
    r.state = static_cast<FlightState>(state);
    // Only whether it started matters once it has crossed hosts.
    r.started_ns = started;
    p.pending = r;
  }
  return p;
}

}  // namespace ddprun::agent
