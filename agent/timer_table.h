// The file timers of the workers on this node, as torch's FileTimerServer keeps them: one
// per (pid, scope_id), set or replaced by a request and removed by a release. When any
// timer of a process has expired, the process is due: it is killed with the signal of its
// earliest expired timer that names one, and all its timers are dropped. Plain data with
// the time passed in (wall-clock seconds, as the requests carry it), so tests need no clock.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agent/timer_request.h"

namespace ddprun::agent {

// A process whose timer expired.
struct TimerExpiry {
  int64_t pid = 0;
  // The timer that decides: the earliest expired one with a signal > 0, else the earliest.
  TimerRequest timer;
  int signal = 0;                           // timer.signal when > 0; 0: no timer asked for a kill.
  std::vector<std::string> expired_scopes;  // every expired scope of the process, earliest first.
};

class TimerTable {
 public:
  // Sets, replaces or (a release) removes the timer of (request.pid, request.scope_id).
  void apply(const TimerRequest& request);
  // Takes out every process with a timer expired at `now` (expiration_time <= now) and
  // all of that process's timers; in pid order.
  std::vector<TimerExpiry> takeExpired(double now);
  // The earliest expiration time in the table; nothing when it is empty.
  std::optional<double> nextExpiration() const;
  // Drops every timer (the attempt whose processes set them is over).
  void clear() { timers_.clear(); }
  size_t size() const { return timers_.size(); }

 private:
  std::map<std::pair<int64_t, std::string>, TimerRequest> timers_;
};

}  // namespace ddprun::agent
