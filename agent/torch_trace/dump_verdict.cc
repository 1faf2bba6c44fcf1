#include "agent/torch_trace/dump_verdict.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "agent/hang/rings/hang_verdict.h"
#include "common/text_escape.h"

namespace ddprun::agent {

const char* rankStandingName(RankStanding standing) {
  switch (standing) {
    case RankStanding::kWaiting: return "waiting";
    case RankStanding::kBehind: return "behind";
    case RankStanding::kMismatch: return "mismatch";
    case RankStanding::kDone: return "done";
    case RankStanding::kUnknown: return "unknown";
  }
  return "?";
}

namespace {

using Entries = std::vector<const FlightEntry*>;

// A dump's text (op names, sizes, dtypes, frames) is the worker's: a verdict line quotes at
// most this many bytes of each piece, and at most kMaxOpsNamed ops of one coalesced call, so
// 30,000 entries of one sequence number cannot make a 330 KB line (issue 44).
constexpr size_t kMaxQuotedBytes = 256;
constexpr size_t kMaxOpsNamed = 4;

// `text` cut to kMaxQuotedBytes, never inside a UTF-8 sequence, ending in "..." when cut.
std::string clipped(std::string text) {
  if (text.size() <= kMaxQuotedBytes) return text;
  size_t end = kMaxQuotedBytes - 3;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  text.resize(end);
  return text + "...";
}

// A worker's string as a verdict shows it: escaped (printable) and clipped.
std::string quoted(std::string_view text) { return clipped(printable(text.substr(0, kMaxQuotedBytes))); }

std::string ranksWord(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + rankRanges(ranks);
}
const char* verb(const std::vector<int>& ranks, const char* one, const char* many) {
  return ranks.size() == 1 ? one : many;
}

std::string sizesText(const std::vector<std::vector<int64_t>>& sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) out += ", ";
    out += "[";
    for (size_t j = 0; j < sizes[i].size(); ++j) out += (j ? ", " : "") + std::to_string(sizes[i][j]);
    out += "]";
    if (out.size() > kMaxQuotedBytes) break;
  }
  return clipped(out + "]");
}

std::string dtypesText(const std::vector<std::string>& dtypes) {
  std::set<std::string> unique(dtypes.begin(), dtypes.end());
  std::string out;
  for (const auto& d : unique) {
    out += (out.empty() ? "" : ",") + quoted(d);
    if (out.size() > kMaxQuotedBytes) break;
  }
  return out.empty() ? "-" : clipped(out);
}

std::string frameText(const FlightFrame& f) {
  std::string out = quoted(f.filename) + ":" + std::to_string(f.line);
  if (!f.name.empty()) out += " in " + quoted(f.name);
  return out;
}

bool pending(const FlightEntry& e) { return e.state != FlightEntryState::kCompleted; }

// When a pending entry began to wait: started if torch saw it start, else created.
int64_t waitStart(const FlightEntry& e) { return e.time_started_ns.value_or(e.time_created_ns); }

std::string groupLabel(const std::string& name, const std::string& desc) {
  std::string out = "group " + quoted(name);
  if (!desc.empty() && desc != "undefined") out += " (" + quoted(desc) + ")";
  return out;
}

// An operation as the ranks must agree on it: its op, sizes and dtypes, for every entry
// under one sequence number (a coalesced batch has several).
struct Signature {
  std::vector<std::string> ops;
  std::vector<std::vector<std::vector<int64_t>>> in_sizes, out_sizes;
  std::vector<std::set<std::string>> in_dtypes, out_dtypes;
  bool operator==(const Signature&) const = default;
};

// Ops whose sizes legitimately differ across ranks (per-rank splits, a root's extra list).
bool sizesMayDiffer(const std::string& op) {
  return op.find("all_to_all") != std::string::npos || op.find("alltoall") != std::string::npos || op == "scatter" ||
         op == "gather" || op.find("_v") != std::string::npos || op == "coalesced";
}

Signature signatureOf(const Entries& entries) {
  Signature s;
  for (const FlightEntry* e : entries) {
    s.ops.push_back(e->op);
    const bool sizes = !sizesMayDiffer(e->op);
    s.in_sizes.push_back(sizes ? e->input_sizes : decltype(e->input_sizes){});
    s.out_sizes.push_back(sizes ? e->output_sizes : decltype(e->output_sizes){});
    s.in_dtypes.emplace_back(e->input_dtypes.begin(), e->input_dtypes.end());
    s.out_dtypes.emplace_back(e->output_dtypes.begin(), e->output_dtypes.end());
  }
  return s;
}

std::string opName(const Entries& entries) {
  std::string out;
  for (size_t i = 0; i < entries.size() && i < kMaxOpsNamed; ++i) {
    out += (i ? "+" : "") + quoted(entries[i]->op);
  }
  if (entries.size() > kMaxOpsNamed) out += fmt::format("+... ({} ops)", entries.size());
  return out;
}

// How `got` differs from `want`, as "broadcast where rank 0 called all_reduce" or "all_reduce
// with input sizes [[4]] where rank 0 has [[8]]".
std::string difference(const Entries& got, const Entries& want, const std::vector<int>& want_ranks) {
  const std::string want_who = ranksWord(want_ranks);
  const char* has = verb(want_ranks, "has", "have");
  const Signature a = signatureOf(got);
  const Signature b = signatureOf(want);
  if (a.ops != b.ops) return fmt::format("{} where {} called {}", opName(got), want_who, opName(want));
  for (size_t i = 0; i < a.ops.size(); ++i) {
    if (a.in_sizes[i] != b.in_sizes[i]) {
      return fmt::format("{} with input sizes {} where {} {} {}", quoted(a.ops[i]), sizesText(a.in_sizes[i]), want_who,
                         has, sizesText(b.in_sizes[i]));
    }
    if (a.out_sizes[i] != b.out_sizes[i]) {
      return fmt::format("{} with output sizes {} where {} {} {}", quoted(a.ops[i]), sizesText(a.out_sizes[i]),
                         want_who, has, sizesText(b.out_sizes[i]));
    }
    if (a.in_dtypes[i] != b.in_dtypes[i] || a.out_dtypes[i] != b.out_dtypes[i]) {
      const bool in = a.in_dtypes[i] != b.in_dtypes[i];
      const auto& mine = in ? got[i]->input_dtypes : got[i]->output_dtypes;
      const auto& theirs = in ? want[i]->input_dtypes : want[i]->output_dtypes;
      return fmt::format("{} of dtype {} where {} {} {}", quoted(a.ops[i]), dtypesText(mine), want_who, has,
                         dtypesText(theirs));
    }
  }
  return opName(got);
}

// Where a rank stands overall: its newest entry anywhere (any group), for a rank that never
// reached the operation in question.
std::string lastCalled(const FlightDump& dump, const std::string& group, std::optional<FlightFrame>& site) {
  if (dump.entries.empty()) return "no operation in its dump";
  const FlightEntry& e = dump.entries.back();
  site = callSite(e.frames);
  std::string where = e.pg_name == group ? "" : " of " + groupLabel(e.pg_name, e.pg_desc);
  const int64_t seq = e.is_p2p ? e.p2p_seq_id : e.collective_seq_id;
  return fmt::format("last called {}{} #{}{} ({})", e.is_p2p ? "p2p " : "", quoted(e.op), seq, where,
                     flightEntryStateName(e.state));
}

std::string waitedText(const std::vector<const FlightEntry*>& waiting, const DumpVerdictOptions& options) {
  if (!options.now_ns || waiting.empty()) return "";
  int64_t earliest = waitStart(*waiting.front());
  for (const FlightEntry* e : waiting) earliest = std::min(earliest, waitStart(*e));
  if (earliest <= 0 || *options.now_ns < earliest) return "";
  return fmt::format(" for {:.1f} s", (*options.now_ns - earliest) / 1e9);
}

struct GroupInfo {
  std::string name;
  std::string desc;
  std::vector<int> members;  // ascending global ranks
};

class VerdictBuilder {
 public:
  VerdictBuilder(const std::vector<FlightDump>& dumps, const DumpVerdictOptions& options) : options_(options) {
    for (const FlightDump& d : dumps) by_rank_[d.rank] = &d;
    finished_.insert(options.finished_ranks.begin(), options.finished_ranks.end());
  }

  DumpVerdict run() {
    DumpVerdict verdict;
    verdict.ranks = by_rank_.size();
    std::vector<GroupInfo> groups = collectGroups();
    verdict.groups = groups.size();
    for (const GroupInfo& g : groups) {
      if (auto f = collectives(g)) verdict.findings.push_back(std::move(*f));
      for (GroupFinding& f : pointToPoint(g)) verdict.findings.push_back(std::move(f));
    }
    std::set<int> all, waiting;
    for (const GroupFinding& f : verdict.findings) {
      all.insert(f.culprits.begin(), f.culprits.end());
      for (const RankStand& r : f.ranks) {
        if (r.standing == RankStanding::kWaiting) waiting.insert(r.rank);
      }
    }
    for (int r : all) {
      if (!waiting.count(r)) verdict.culprits.push_back(r);
    }
    if (verdict.culprits.empty()) verdict.culprits.assign(all.begin(), all.end());
    return verdict;
  }

 private:
  // Every group named in a dump's pg_config or entries, in order of first appearance, with
  // its members: the ranks pg_config gives it (the union over the dumps), else the ranks whose
  // entries name it.
  std::vector<GroupInfo> collectGroups() {
    std::vector<GroupInfo> groups;
    std::map<std::string, size_t> index;
    std::map<std::string, std::set<int>> configured, seen;
    auto find = [&](const std::string& name, const std::string& desc) -> GroupInfo& {
      auto [it, fresh] = index.emplace(name, groups.size());
      if (fresh) groups.push_back(GroupInfo{name, desc, {}});
      GroupInfo& g = groups[it->second];
      if (g.desc.empty()) g.desc = desc;
      return g;
    };
    for (const auto& [rank, dump] : by_rank_) {
      for (const FlightEntry& e : dump->entries) {
        find(e.pg_name, e.pg_desc);
        seen[e.pg_name].insert(rank);
      }
      for (const FlightGroupConfig& c : dump->groups) {
        // pg_config lists every group the rank created; only those with operations matter.
        if (!index.count(c.name)) continue;
        find(c.name, c.desc);
        configured[c.name].insert(c.ranks.begin(), c.ranks.end());
      }
    }
    for (GroupInfo& g : groups) {
      const std::set<int>& from = configured[g.name].empty() ? seen[g.name] : configured[g.name];
      g.members.assign(from.begin(), from.end());
    }
    return groups;
  }

  const FlightDump* dumpOf(int rank) const {
    auto it = by_rank_.find(rank);
    return it == by_rank_.end() ? nullptr : it->second;
  }

  std::optional<GroupFinding> collectives(const GroupInfo& g) {
    struct RankOps {
      const FlightDump* dump = nullptr;
      std::map<int64_t, Entries> by_seq;
      int64_t first = 0, last = 0;
    };
    std::map<int, RankOps> ranks;
    bool any = false;
    int64_t lo = 1;
    for (int r : g.members) {
      RankOps& ops = ranks[r];
      ops.dump = dumpOf(r);
      if (!ops.dump) continue;
      for (const FlightEntry& e : ops.dump->entries) {
        if (e.pg_name != g.name || e.is_p2p) continue;
        ops.by_seq[e.collective_seq_id].push_back(&e);
        any = true;
      }
      if (!ops.by_seq.empty()) {
        ops.first = ops.by_seq.begin()->first;
        ops.last = ops.by_seq.rbegin()->first;
      }
      // A ring that overwrote its oldest entries says nothing before its first one.
      if (ops.dump->truncated && !ops.by_seq.empty()) lo = std::max(lo, ops.first);
    }
    if (!any) return std::nullopt;
    std::set<int64_t> seqs;
    for (const auto& [r, ops] : ranks) {
      for (const auto& [seq, entries] : ops.by_seq) {
        if (seq >= lo) seqs.insert(seq);
      }
    }
    for (int64_t seq : seqs) {
      bool problem = false;
      std::optional<Signature> first;
      for (const auto& [r, ops] : ranks) {
        if (!ops.dump) continue;
        auto it = ops.by_seq.find(seq);
        if (it == ops.by_seq.end()) {
          if (seq > ops.last) problem = true;
          continue;
        }
        Signature s = signatureOf(it->second);
        if (first && !(s == *first)) problem = true;
        if (!first) first = std::move(s);
        for (const FlightEntry* e : it->second) problem = problem || pending(*e);
      }
      if (problem) return classify(g, seq, ranks);
    }
    return std::nullopt;
  }

  template <class RankOpsMap>
  GroupFinding classify(const GroupInfo& g, int64_t seq, const RankOpsMap& ranks) {
    GroupFinding f;
    f.group = groupLabel(g.name, g.desc);
    // The reference: what most ranks called there (the lowest rank's on a tie).
    std::vector<std::pair<Signature, std::vector<int>>> votes;
    for (const auto& [r, ops] : ranks) {
      if (!ops.dump) continue;
      auto it = ops.by_seq.find(seq);
      if (it == ops.by_seq.end()) continue;
      Signature s = signatureOf(it->second);
      auto v = std::find_if(votes.begin(), votes.end(), [&](const auto& p) { return p.first == s; });
      if (v == votes.end()) {
        votes.emplace_back(std::move(s), std::vector<int>{r});
      } else {
        v->second.push_back(r);
      }
    }
    size_t best = 0;
    for (size_t i = 1; i < votes.size(); ++i) {
      if (votes[i].second.size() > votes[best].second.size()) best = i;
    }
    const std::vector<int>& ref_ranks = votes[best].second;
    const Entries& ref = ranks.at(ref_ranks.front()).by_seq.at(seq);
    const std::string ref_op = opName(ref);

    std::vector<int> waiting, behind, done, unknown;
    std::vector<const FlightEntry*> waiting_entries;
    std::map<std::string, std::vector<int>> mismatches;  // how they differ -> ranks
    for (const auto& [r, ops] : ranks) {
      RankStand stand;
      stand.rank = r;
      if (!ops.dump) {
        stand.standing = RankStanding::kUnknown;
        stand.doing = "no dump";
        unknown.push_back(r);
      } else if (auto it = ops.by_seq.find(seq); it != ops.by_seq.end()) {
        const Entries& mine = it->second;
        const FlightEntry& e = *mine.front();
        stand.call_site = callSite(e.frames);
        const bool is_pending = std::any_of(mine.begin(), mine.end(), [](const FlightEntry* x) { return pending(*x); });
        if (!(signatureOf(mine) == votes[best].first)) {
          stand.standing = RankStanding::kMismatch;
          mismatches[difference(mine, ref, ref_ranks)].push_back(r);
          stand.doing = fmt::format("called {} #{} ({})", opName(mine), seq, flightEntryStateName(e.state));
        } else if (is_pending) {
          stand.standing = RankStanding::kWaiting;
          waiting.push_back(r);
          for (const FlightEntry* x : mine) waiting_entries.push_back(x);
          stand.doing = fmt::format("in {} #{} ({})", opName(mine), seq, flightEntryStateName(e.state));
        } else {
          stand.standing = RankStanding::kDone;
          done.push_back(r);
          stand.doing = fmt::format("completed {} #{}", opName(mine), seq);
        }
      } else if (seq > ops.last) {
        if (finished_.count(r)) {
          stand.standing = RankStanding::kDone;
          stand.doing = "finished";
          done.push_back(r);
        } else {
          stand.standing = RankStanding::kBehind;
          stand.doing = lastCalled(*ops.dump, g.name, stand.call_site);
          behind.push_back(r);
        }
      } else {
        stand.standing = RankStanding::kUnknown;
        stand.doing = fmt::format("its dump has no #{}", seq);
        unknown.push_back(r);
      }
      f.ranks.push_back(std::move(stand));
    }

    const std::string at = fmt::format("{} #{} of {}", ref_op, seq, f.group);
    const std::string waited = waitedText(waiting_entries, options_);
    std::vector<std::string> clauses;
    if (!behind.empty()) {
      std::string s = fmt::format("{} {} not called {}", ranksWord(behind), verb(behind, "has", "have"), at);
      if (!waiting.empty()) {
        s += waited.empty()
                 ? fmt::format("; {} {} in it", ranksWord(waiting), verb(waiting, "waits", "wait"))
                 : fmt::format("; {} {} waited in it{}", ranksWord(waiting), verb(waiting, "has", "have"), waited);
      }
      s += fmt::format(" — {} {} behind", ranksWord(behind), verb(behind, "is", "are"));
      clauses.push_back(std::move(s));
      f.culprits.insert(f.culprits.end(), behind.begin(), behind.end());
    }
    for (const auto& [how, who] : mismatches) {
      clauses.push_back(fmt::format("{} called {} (#{} of {}) — {} {}", ranksWord(who), how, seq, f.group,
                                    ranksWord(who), verb(who, "mismatches", "mismatch")));
      f.culprits.insert(f.culprits.end(), who.begin(), who.end());
    }
    if (clauses.empty()) {
      std::string s = fmt::format("{} {} in {}{}", ranksWord(waiting), verb(waiting, "waits", "wait"), at, waited);
      s += unknown.empty() ? ", called alike by every rank — no rank is behind"
                           : fmt::format("; {} cannot tell (no dump reaching it)", ranksWord(unknown));
      clauses.push_back(std::move(s));
    }
    f.line = "hang: " + clauses.front();
    for (size_t i = 1; i < clauses.size(); ++i) f.line += "; " + clauses[i];
    std::sort(f.culprits.begin(), f.culprits.end());
    return f;
  }

  std::vector<GroupFinding> pointToPoint(const GroupInfo& g) {
    struct P2pOp {
      const FlightEntry* e;
      bool send;
      int peer;  // global rank
    };
    std::map<int, std::vector<P2pOp>> ops;
    for (int r : g.members) {
      const FlightDump* d = dumpOf(r);
      if (!d) continue;
      for (const FlightEntry& e : d->entries) {
        if (e.pg_name != g.name || !e.is_p2p || (e.op != "send" && e.op != "recv")) continue;
        const int peer_in_group = e.op == "send" ? e.p2p_dst : e.p2p_src;
        if (peer_in_group < 0 || static_cast<size_t>(peer_in_group) >= g.members.size()) continue;
        ops[r].push_back({&e, e.op == "send", g.members[static_cast<size_t>(peer_in_group)]});
      }
    }
    std::vector<GroupFinding> findings;
    std::set<std::tuple<int, int, size_t>> reported;  // (sender, receiver, k)
    const std::string group = groupLabel(g.name, g.desc);
    for (const auto& [a, list] : ops) {
      auto it = std::find_if(list.begin(), list.end(), [](const P2pOp& o) { return pending(*o.e); });
      if (it == list.end()) continue;
      const P2pOp& mine = *it;
      const int b = mine.peer;
      size_t k = 0;  // how many earlier ops of a went the same way to the same peer
      for (auto j = list.begin(); j != it; ++j) k += (j->send == mine.send && j->peer == b) ? 1 : 0;
      const int sender = mine.send ? a : b;
      const int receiver = mine.send ? b : a;
      if (!reported.insert({sender, receiver, k}).second) continue;
      const FlightDump* peer_dump = dumpOf(b);
      if (dumpOf(a)->truncated || (peer_dump && peer_dump->truncated)) continue;  // counts unknown

      GroupFinding f;
      f.group = group;
      f.p2p = true;
      const char* my_op = mine.send ? "send" : "recv";
      const char* their_op = mine.send ? "recv" : "send";
      const std::string mine_text =
          fmt::format("{} {} rank {} (p2p #{} of {})", my_op, mine.send ? "to" : "from", b, mine.e->p2p_seq_id, group);
      RankStand me{a, RankStanding::kWaiting,
                   fmt::format("in {} {} rank {} (p2p #{}, {})", my_op, mine.send ? "to" : "from", b,
                               mine.e->p2p_seq_id, flightEntryStateName(mine.e->state)),
                   callSite(mine.e->frames)};
      const std::string waited = waitedText({mine.e}, options_);
      const std::string waits = waited.empty() ? fmt::format("rank {} waits in {}", a, mine_text)
                                               : fmt::format("rank {} has waited in {}{}", a, mine_text, waited);

      std::vector<const P2pOp*> counterparts;
      if (auto p = ops.find(b); p != ops.end()) {
        for (const P2pOp& o : p->second) {
          if (o.send != mine.send && o.peer == a) counterparts.push_back(&o);
        }
      }
      RankStand them{b, RankStanding::kUnknown, "", std::nullopt};
      if (!peer_dump) {
        them.doing = "no dump";
        f.line = fmt::format("hang: {}; rank {} left no dump to tell", waits, b);
      } else if (counterparts.size() <= k) {
        if (finished_.count(b)) {
          them.standing = RankStanding::kDone;
          them.doing = "finished";
          f.line = fmt::format("hang: {}; rank {} finished without the matching {}", waits, b, their_op);
        } else {
          them.standing = RankStanding::kBehind;
          them.doing = lastCalled(*peer_dump, g.name, them.call_site);
          f.line = fmt::format("hang: rank {} has not called the {} {} rank {}; {} — rank {} is behind", b, their_op,
                               mine.send ? "from" : "to", a, waits, b);
          f.culprits.push_back(b);
        }
      } else {
        const FlightEntry& other = *counterparts[k]->e;
        const FlightEntry& send = mine.send ? *mine.e : other;
        const FlightEntry& recv = mine.send ? other : *mine.e;
        them.call_site = callSite(other.frames);
        const bool sizes_differ =
            !send.input_sizes.empty() && !recv.output_sizes.empty() && send.input_sizes != recv.output_sizes;
        const bool dtypes_differ = !send.input_dtypes.empty() && !recv.output_dtypes.empty() &&
                                   dtypesText(send.input_dtypes) != dtypesText(recv.output_dtypes);
        them.doing = fmt::format("in {} {} rank {} (p2p #{}, {})", their_op, mine.send ? "from" : "to", a,
                                 other.p2p_seq_id, flightEntryStateName(other.state));
        if (sizes_differ || dtypes_differ) {
          them.standing = RankStanding::kMismatch;
          const std::string what =
              sizes_differ
                  ? fmt::format("sizes {} where the {} has {}",
                                sizesText(other.input_sizes.empty() ? other.output_sizes : other.input_sizes), my_op,
                                sizesText(mine.e->input_sizes.empty() ? mine.e->output_sizes : mine.e->input_sizes))
                  : fmt::format("dtype {} where the {} has {}", dtypesText(other.input_dtypes), my_op,
                                dtypesText(mine.e->input_dtypes));
          f.line = fmt::format("hang: rank {} called the {} {} rank {} with {}; {} — rank {} mismatches", b, their_op,
                               mine.send ? "from" : "to", a, what, waits, b);
          f.culprits.push_back(b);
        } else if (pending(other)) {
          them.standing = RankStanding::kWaiting;
          f.line = fmt::format("hang: {}; rank {} waits in the matching {} — no rank is behind", waits, b, their_op);
        } else {
          them.standing = RankStanding::kDone;
          f.line = fmt::format("hang: {}; rank {} completed the matching {}", waits, b, their_op);
        }
      }
      f.ranks.push_back(std::move(me));
      f.ranks.push_back(std::move(them));
      findings.push_back(std::move(f));
    }
    return findings;
  }

  const DumpVerdictOptions& options_;
  std::map<int, const FlightDump*> by_rank_;
  std::set<int> finished_;
};

}  // namespace

std::string DumpVerdict::text() const {
  if (findings.empty()) {
    return fmt::format("no hang: the dumps of {} {} agree on every operation of {} {}, and none is pending\n", ranks,
                       ranks == 1 ? "rank" : "ranks", groups, groups == 1 ? "group" : "groups");
  }
  std::string out;
  for (const GroupFinding& f : findings) {
    out += f.line + "\n";
    for (const RankStand& r : f.ranks) {
      // "rank 0: waiting in all_reduce #2 (started), called at f.py:14 in main",
      // "rank 1: behind, last called all_reduce #1 (completed) at f.py:12 in main".
      const bool inside = r.doing.rfind("in ", 0) == 0;
      out += fmt::format("  rank {}: {}", r.rank, rankStandingName(r.standing));
      if (!r.doing.empty()) out += (inside ? " " : ", ") + r.doing;
      if (r.call_site) out += (inside ? ", called at " : " at ") + frameText(*r.call_site);
      out += "\n";
    }
  }
  if (findings.size() > 1 && !culprits.empty()) {
    out += fmt::format("hang: root cause {}\n", ranksWord(culprits));
  }
  return out;
}

DumpVerdict dumpVerdict(const std::vector<FlightDump>& dumps, const DumpVerdictOptions& options) {
  return VerdictBuilder(dumps, options).run();
}

}  // namespace ddprun::agent
