#include "worker_runtime/rpc/pending_calls.h"

#include <fmt/format.h>

#include <vector>

namespace ddprun::rpc::detail {

void PendingCalls::add(uint64_t id, PendingCall call) {
  std::lock_guard lock(mutex_);
  calls_.emplace(id, std::move(call));
}

std::optional<PendingCall> PendingCalls::takeReply(uint64_t id, const std::shared_ptr<Connection>& conn) {
  std::optional<PendingCall> call;
  {
    std::lock_guard lock(mutex_);
    auto it = calls_.find(id);
    if (it == calls_.end()) return std::nullopt;
    if (it->second.connection != conn) {
      throw DdprunError(fmt::format("a reply to call {} that was not sent on this connection", id));
    }
    call = std::move(it->second);
    calls_.erase(it);
  }
  on_settled_(1);
  return call;
}

bool PendingCalls::fail(uint64_t id, std::exception_ptr error) {
  std::optional<PendingCall> call;
  {
    std::lock_guard lock(mutex_);
    auto it = calls_.find(id);
    if (it == calls_.end()) return false;
    call = std::move(it->second);
    calls_.erase(it);
  }
  on_settled_(1);
  call->future.set_exception(std::move(error));
  return true;
}

size_t PendingCalls::failMatching(const std::function<bool(const PendingCall&)>& match,
                                  const std::function<std::exception_ptr(const PendingCall&)>& error) {
  std::vector<PendingCall> failed;
  {
    std::lock_guard lock(mutex_);
    for (auto it = calls_.begin(); it != calls_.end();) {
      if (match(it->second)) {
        failed.push_back(std::move(it->second));
        it = calls_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (failed.empty()) return 0;
  on_settled_(failed.size());
  for (auto& call : failed) call.future.set_exception(error(call));
  return failed.size();
}

}  // namespace ddprun::rpc::detail
