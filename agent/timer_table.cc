#include "agent/timer_table.h"

#include <algorithm>
#include <set>

namespace ddprun::agent {

void TimerTable::apply(const TimerRequest& request) {
  auto key = std::make_pair(request.pid, request.scope_id);
  if (request.isRelease()) {
    timers_.erase(key);
  } else {
    timers_[key] = request;
  }
}

std::vector<TimerExpiry> TimerTable::takeExpired(double now) {
  std::set<int64_t> due;
  for (const auto& [key, timer] : timers_) {
    if (timer.expiration_time <= now) due.insert(key.first);
  }
  std::vector<TimerExpiry> expiries;
  for (int64_t pid : due) {
    std::vector<TimerRequest> expired;
    for (auto it = timers_.lower_bound({pid, std::string()}); it != timers_.end() && it->first.first == pid;) {
      if (it->second.expiration_time <= now) expired.push_back(it->second);
      // As torch clears them: a process that is killed keeps none of its timers.
      it = timers_.erase(it);
    }
    std::stable_sort(expired.begin(), expired.end(), [](const TimerRequest& a, const TimerRequest& b) {
      return a.expiration_time < b.expiration_time;
    });
    TimerExpiry expiry;
    expiry.pid = pid;
    expiry.timer = expired.front();
    for (const TimerRequest& timer : expired) {
      expiry.expired_scopes.push_back(timer.scope_id);
      if (expiry.signal == 0 && timer.signal > 0) {
        expiry.signal = timer.signal;
        expiry.timer = timer;
      }
    }
    expiries.push_back(std::move(expiry));
  }
  return expiries;
}

std::optional<double> TimerTable::nextExpiration() const {
  std::optional<double> next;
  for (const auto& [key, timer] : timers_) {
    if (!next || timer.expiration_time < *next) next = timer.expiration_time;
  }
  return next;
}

}  // namespace ddprun::agent
