#include "agent/hang/timers/timer_table.h"

#include <algorithm>

namespace ddprun::agent {

TimerApplied TimerTable::apply(const TimerRequest& request, int64_t owner) {
  Key key(request.pid, request.scope_id);
  auto it = timers_.find(key);
  if (request.isRelease()) {
    if (it != timers_.end()) erase(it);
    return TimerApplied::kReleased;
  }
  if (it != timers_.end()) {
    // Moved: the old deadline leaves the index, the new one enters; the owner stays the one
    // that the timer was first counted against.
    deadlines_.erase({it->second.expiration_time, &it->first});
    it->second.expiration_time = request.expiration_time;
    it->second.signal = request.signal;
    it->second.version = request.version;
    deadlines_.insert({request.expiration_time, &it->first});
    return TimerApplied::kReplaced;
  }
  size_t& count = per_owner_[owner];
  if (count >= max_per_worker_) return TimerApplied::kRefused;
  ++count;
  it = timers_.emplace(std::move(key), Timer{request.expiration_time, request.signal, request.version, owner}).first;
  deadlines_.insert({request.expiration_time, &it->first});
  return TimerApplied::kSet;
}

TimerTable::Timers::iterator TimerTable::erase(Timers::iterator it) {
  deadlines_.erase({it->second.expiration_time, &it->first});
  auto owned = per_owner_.find(it->second.owner);
  if (owned != per_owner_.end() && --owned->second == 0) per_owner_.erase(owned);
  return timers_.erase(it);
}

std::vector<TimerExpiry> TimerTable::takeExpired(double now) {
  std::vector<int64_t> due;
  for (auto it = deadlines_.begin(); it != deadlines_.end() && it->first <= now; ++it) due.push_back(it->second->first);
  std::sort(due.begin(), due.end());
  due.erase(std::unique(due.begin(), due.end()), due.end());

  std::vector<TimerExpiry> expiries;
  for (int64_t pid : due) {
    std::vector<TimerRequest> expired;
    for (auto it = timers_.lower_bound({pid, std::string()}); it != timers_.end() && it->first.first == pid;) {
      if (it->second.expiration_time <= now) {
        TimerRequest timer;
        timer.version = it->second.version;
        timer.pid = pid;
        timer.scope_id = it->first.second;
        timer.expiration_time = it->second.expiration_time;
        timer.signal = it->second.signal;
        expired.push_back(std::move(timer));
      }
      // As torch clears them: a process that is killed keeps none of its timers.
      it = erase(it);
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
  if (deadlines_.empty()) return std::nullopt;
  return deadlines_.begin()->first;
}

void TimerTable::clear() {
  deadlines_.clear();
  timers_.clear();
  per_owner_.clear();
}

size_t TimerTable::countOf(int64_t owner) const {
  auto it = per_owner_.find(owner);
  return it == per_owner_.end() ? 0 : it->second;
}

}  // namespace ddprun::agent
