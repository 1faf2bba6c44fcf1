#include "worker_runtime/rpc/rref_owner_table.h"

#include <fmt/format.h>

#include "worker_runtime/rpc/internal.h"

namespace ddprun::rpc::detail {

void RRefOwnerTable::registerValue(int64_t creator, int64_t serial, Future value, int64_t refs) {
  std::lock_guard lock(mutex_);
  auto& e = owned_[{creator, serial}];
  e.value = value;
  e.refs += refs;
}

void RRefOwnerTable::add(int64_t creator, int64_t serial, int64_t n) {
  Entry dropped;
  {
    std::lock_guard lock(mutex_);
    auto it = owned_.find({creator, serial});
    if (it == owned_.end()) {
      if (n > 0) rpcLog()->warn("rpc: reference added to RRef {}:{}:{} that no longer exists", rank_, creator, serial);
      return;
    }
    it->second.refs += n;
    if (it->second.refs <= 0) {
      dropped = std::move(it->second);
      owned_.erase(it);
    }
  }
  // `dropped` (and any RRefs inside its value) is released here, outside the
  // lock.
}

Future RRefOwnerTable::value(int64_t creator, int64_t serial) {
  std::lock_guard lock(mutex_);
  auto it = owned_.find({creator, serial});
  if (it == owned_.end()) {
    throw DdprunError(fmt::format("rpc: RRef {}:{}:{} does not exist on its owner (released)", rank_, creator, serial));
  }
  return it->second.value;
}

int64_t RRefOwnerTable::count() {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(owned_.size());
}

void RRefOwnerTable::clear() {
  std::map<std::pair<int64_t, int64_t>, Entry> owned;
  {
    std::lock_guard lock(mutex_);
    owned.swap(owned_);
  }
  owned.clear();
}

}  // namespace ddprun::rpc::detail
