// Stragglers: which rank keeps the others waiting at the collectives, from the flight
// recorder rings (common/flight_ring.h) that ddprun's C++ runtime and its Python hook write.
//
// The measure must hold across hosts whose CLOCK_MONOTONIC differ, so it compares durations,
// never timestamps: a rank's wait inside a completed collective (its end minus its entry,
// which is when it started, else when it was enqueued). Ranks leave a collective together,
// so the rank that enters last waits least: over a window of its last completed collectives,
//   lag(r) = median over the group's ranks of their mean wait - mean wait of r
// is how far behind the median rank r enters them, on average. One rank late by 50 ms into
// every collective of 3 shows a lag of about 50 ms; the others about 0. With 2 ranks the
// median lies between them, so the late one shows half its delay.
//
// Each node summarises its own ranks (RankProgress), which is all that crosses hosts; the
// comparison (groupMedians, lagsOf) runs where every node's summaries meet. Pure functions
// over plain data (no clock, no I/O), and StragglerTracker's thresholds and hysteresis.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "common/flight_ring.h"

namespace ddprun::agent {

// The completed collectives of a rank's window: its newest ones, at most this many.
inline constexpr size_t kStragglerWindow = 64;
// A rank with fewer completed collectives in its window is not judged (nor counted in its
// group's median): a few collectives say little, and a job's first ones (connections made,
// buffers allocated) are slow on every rank in their own ways.
inline constexpr uint32_t kStragglerMinCollectives = 16;

// What one node says of one rank in one group.
struct RankProgress {
  int rank = 0;                     // global rank
  int group = 0;                    // 0: the default group
  uint64_t last_completed_seq = 0;  // the newest collective it completed
  uint32_t collectives = 0;         // completed collectives in its window (at most kStragglerWindow)
  double mean_wait_s = 0;           // their mean wait, in seconds
};

// A rank's progress from its collective ring (`window` newest completed collectives; failed
// ones do not count). nullopt for a point-to-point ring or one without a completed collective.
std::optional<RankProgress> progressOf(const FlightRingSnapshot& ring, size_t window = kStragglerWindow);

// A group's median of its ranks' mean waits, over the ranks judged (`ranks` of them).
struct GroupMedian {
  int group = 0;
  double median_wait_s = 0;
  uint32_t ranks = 0;
};

// Per group (ascending), the median over its ranks with at least `min_collectives` in their
// windows; a group with fewer than 2 such ranks has none (nothing to compare). A rank listed
// twice for a group counts once (its first entry).
std::vector<GroupMedian> groupMedians(const std::vector<RankProgress>& ranks,
                                      uint32_t min_collectives = kStragglerMinCollectives);

// One rank's lag in one group: how far behind its group's median rank it enters collectives.
struct RankLag {
  int rank = 0;
  int group = 0;
  double lag_s = 0;  // median wait - its mean wait; negative: ahead of the median
  double mean_wait_s = 0;
  uint32_t collectives = 0;
  uint64_t last_completed_seq = 0;
};

// Each rank's largest lag over its groups that have a median (against `medians`), for the
// ranks with at least `min_collectives`; ascending by rank. A rank with no judged group is
// left out: no judgement, which is not the same as no lag.
std::vector<RankLag> lagsOf(const std::vector<RankProgress>& ranks, const std::vector<GroupMedian>& medians,
                            uint32_t min_collectives = kStragglerMinCollectives);

// Which ranks straggle now: a rank becomes one when its lag exceeds the threshold, and stops
// being one when its lag falls under half of it (so that a lag near the threshold does not
// say so every look), or when reset() says a new attempt began. A rank not judged in an
// update keeps its state. Not thread-safe.
class StragglerTracker {
 public:
  // `threshold_s` > 0.
  explicit StragglerTracker(double threshold_s) : threshold_s_(threshold_s) {}

  struct Change {
    RankLag lag;
    bool straggling = false;  // true: crossed the threshold; false: recovered
  };
  // The ranks whose state changed with these lags, ascending by rank.
  std::vector<Change> update(const std::vector<RankLag>& lags);
  // The ranks that straggle now, with their latest lag.
  const std::map<int, RankLag>& stragglers() const { return stragglers_; }
  double threshold() const { return threshold_s_; }
  void reset() { stragglers_.clear(); }

 private:
  double threshold_s_;
  std::map<int, RankLag> stragglers_;
};

}  // namespace ddprun::agent
