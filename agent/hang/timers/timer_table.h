// The file timers of the workers on this node, as torch's FileTimerServer keeps them: one
// per (pid, scope_id), set or replaced by a request and removed by a release. When any
// timer of a process has expired, the process is due: it is killed with the signal of its
// earliest expired timer that names one, and all its timers are dropped. Plain data with
// the time passed in (wall-clock seconds, as the requests carry it), so tests need no clock.
//
// Unlike torch's table it is bounded: each timer counts against the worker its pid belongs
// to (the caller says which), and a worker holding max_per_worker timers has further new
// ones refused (replacing or releasing one of its timers is always accepted). Timers are
// indexed by expiration time, so setting, releasing and taking an expired one cost
// O(log n) and the next expiration O(1): a worker's requests never rescan the table.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "agent/hang/timers/timer_request.h"

namespace ddprun::agent {

// A process whose timer expired.
struct TimerExpiry {
  int64_t pid = 0;
  // The timer that decides: the earliest expired one with a signal > 0, else the earliest.
  TimerRequest timer;
  int signal = 0;                           // timer.signal when > 0; 0: no timer asked for a kill.
  std::vector<std::string> expired_scopes;  // every expired scope of the process, earliest first.
};

// What apply() did with a request.
enum class TimerApplied {
  kSet,       // a new timer
  kReplaced,  // the timer of (pid, scope_id) got the request's time and signal
  kReleased,  // a release that removed a timer; also one that found none (as torch: nothing happens)
  kRefused,   // a new timer of a worker already holding max_per_worker; the table is unchanged
};

class TimerTable {
 public:
  // More than any sane worker holds (torch's own uses are one timer per scope entered),
  // and at most ~4 MiB a worker with scopes as long as a request line allows.
  static constexpr size_t kDefaultMaxPerWorker = 1024;

  explicit TimerTable(size_t max_per_worker = kDefaultMaxPerWorker) : max_per_worker_(max_per_worker) {}

  // Sets, replaces or (a release) removes the timer of (request.pid, request.scope_id).
  // `owner` names the worker whose bound a new timer counts against (the pid of the worker
  // that request.pid is or belongs to). O(log n).
  TimerApplied apply(const TimerRequest& request, int64_t owner);
  TimerApplied apply(const TimerRequest& request) { return apply(request, request.pid); }
  // Takes out every process with a timer expired at `now` (expiration_time <= now) and
  // all of that process's timers; in pid order. O(k log n) for the k timers taken.
  std::vector<TimerExpiry> takeExpired(double now);
  // The earliest expiration time in the table; nothing when it is empty. O(1).
  std::optional<double> nextExpiration() const;
  // Drops every timer (the attempt whose processes set them is over).
  void clear();
  size_t size() const { return timers_.size(); }
  // How many timers count against `owner`.
  size_t countOf(int64_t owner) const;
  size_t maxPerWorker() const { return max_per_worker_; }

 private:
  using Key = std::pair<int64_t, std::string>;  // (pid, scope_id)
  struct Timer {
    double expiration_time = 0;
    int signal = 0;
    int64_t version = 1;
    int64_t owner = 0;
  };
  // By expiration time, then by key; the key points into timers_ (std::map keys stay put).
  struct ByDeadline {
    bool operator()(const std::pair<double, const Key*>& a, const std::pair<double, const Key*>& b) const {
      if (a.first != b.first) return a.first < b.first;
      return *a.second < *b.second;
    }
  };
  using Timers = std::map<Key, Timer>;

  Timers::iterator erase(Timers::iterator it);

  size_t max_per_worker_;
  Timers timers_;
  std::set<std::pair<double, const Key*>, ByDeadline> deadlines_;
  std::unordered_map<int64_t, size_t> per_owner_;
};

}  // namespace ddprun::agent
