#include "agent/hang/rings/straggler.h"

#include <algorithm>
#include <set>
#include <utility>

namespace ddprun::agent {

std::optional<RankProgress> progressOf(const FlightRingSnapshot& ring, size_t window) {
  if (ring.kind != FlightRingKind::kCollective || window == 0) return std::nullopt;
  RankProgress p;
  p.rank = ring.rank;
  p.group = ring.group;
  double total_s = 0;
  // Records are in ascending seq: the window is the newest completed ones.
  for (auto it = ring.records.rbegin(); it != ring.records.rend() && p.collectives < window; ++it) {
    const FlightRecord& r = *it;
    if (r.state != FlightState::kCompleted || r.ended_ns == 0) continue;
    const int64_t entered = r.started_ns != 0 ? r.started_ns : r.enqueued_ns;
    // A worker writes the ring: a stamp that goes backwards counts as no wait, never as less.
    total_s += static_cast<double>(std::max<int64_t>(0, r.ended_ns - entered)) / 1e9;
    p.last_completed_seq = std::max(p.last_completed_seq, r.seq);
    ++p.collectives;
  }
  if (p.collectives == 0) return std::nullopt;
  p.mean_wait_s = total_s / p.collectives;
  return p;
}

namespace {

// The ranks judged, per group, each (group, rank) once.
std::map<int, std::vector<const RankProgress*>> judgedByGroup(const std::vector<RankProgress>& ranks,
                                                              uint32_t min_collectives) {
  std::map<int, std::vector<const RankProgress*>> groups;
  std::set<std::pair<int, int>> seen;
  for (const RankProgress& p : ranks) {
    if (p.collectives < min_collectives || !seen.emplace(p.group, p.rank).second) continue;
    groups[p.group].push_back(&p);
  }
  return groups;
}

}  // namespace

std::vector<GroupMedian> groupMedians(const std::vector<RankProgress>& ranks, uint32_t min_collectives) {
  std::vector<GroupMedian> out;
  for (const auto& [group, members] : judgedByGroup(ranks, min_collectives)) {
    if (members.size() < 2) continue;
    std::vector<double> waits;
    for (const RankProgress* p : members) waits.push_back(p->mean_wait_s);
    std::sort(waits.begin(), waits.end());
    const size_t n = waits.size();
    const double median = n % 2 == 1 ? waits[n / 2] : (waits[n / 2 - 1] + waits[n / 2]) / 2;
    out.push_back(GroupMedian{group, median, static_cast<uint32_t>(n)});
  }
  return out;
}

std::vector<RankLag> lagsOf(const std::vector<RankProgress>& ranks, const std::vector<GroupMedian>& medians,
                            uint32_t min_collectives) {
  std::map<int, double> median_of;
  for (const GroupMedian& m : medians) median_of.emplace(m.group, m.median_wait_s);
  std::map<int, RankLag> worst;
  for (const auto& [group, members] : judgedByGroup(ranks, min_collectives)) {
    const auto median = median_of.find(group);
    if (median == median_of.end()) continue;
    for (const RankProgress* p : members) {
      RankLag lag{p->rank,        p->group,       median->second - p->mean_wait_s,
                  p->mean_wait_s, p->collectives, p->last_completed_seq};
      auto [at, fresh] = worst.emplace(p->rank, lag);
      if (!fresh && lag.lag_s > at->second.lag_s) at->second = lag;
    }
  }
  std::vector<RankLag> out;
  for (auto& [rank, lag] : worst) out.push_back(lag);
  return out;
}

std::vector<StragglerTracker::Change> StragglerTracker::update(const std::vector<RankLag>& lags) {
  std::vector<Change> changes;
  for (const RankLag& lag : lags) {
    auto at = stragglers_.find(lag.rank);
    if (at == stragglers_.end()) {
      if (lag.lag_s > threshold_s_) {
        stragglers_.emplace(lag.rank, lag);
        changes.push_back(Change{lag, true});
      }
    } else if (lag.lag_s < threshold_s_ / 2) {
      stragglers_.erase(at);
      changes.push_back(Change{lag, false});
    } else {
      at->second = lag;
    }
  }
  std::sort(changes.begin(), changes.end(), [](const Change& a, const Change& b) { return a.lag.rank < b.lag.rank; });
  return changes;
}

}  // namespace ddprun::agent
