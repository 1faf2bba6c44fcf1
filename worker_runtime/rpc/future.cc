#include <exception>
#include <functional>
#include <mutex>
#include <vector>

#include "common/error.h"
#include "worker_runtime/rpc/internal.h"
#include "worker_runtime/rpc/rpc.h"

namespace ddprun::rpc {

Future::Future() : state_(std::make_shared<detail::FutureState>()) {}

Value Future::wait() const {
  std::unique_lock lock(state_->mutex);
  state_->cv.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
  return state_->value;
}
bool Future::wait_for(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(state_->mutex);
  return state_->cv.wait_for(lock, timeout, [&] { return state_->done; });
}
bool Future::done() const {
  std::lock_guard lock(state_->mutex);
  return state_->done;
}
Value Future::value() const {
  std::lock_guard lock(state_->mutex);
  DDPRUN_CHECK(state_->done, "Future::value() on a pending future");
  if (state_->error) std::rethrow_exception(state_->error);
  return state_->value;
}
std::exception_ptr Future::exception() const {
  std::lock_guard lock(state_->mutex);
  return state_->error;
}
void Future::add_done_callback(std::function<void(const Future&)> fn) const {
  {
    std::lock_guard lock(state_->mutex);
    if (!state_->done) {
      state_->callbacks.push_back([fn = std::move(fn), self = *this] { fn(self); });
      return;
    }
  }
  fn(*this);
}
Future Future::then(std::function<Value(Future)> fn) const {
  Future next;
  add_done_callback([fn = std::move(fn), next](const Future& done) {
    detail::post([fn, next, done] {
      try {
        next.set_result(fn(done));
      } catch (...) {
        next.set_exception(std::current_exception());
      }
    });
  });
  return next;
}
void Future::set_result(Value value) const {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard lock(state_->mutex);
    DDPRUN_CHECK(!state_->done, "Future completed twice");
    state_->value = std::move(value);
    state_->done = true;
    callbacks.swap(state_->callbacks);
  }
  state_->cv.notify_all();
  for (auto& cb : callbacks) cb();
}
void Future::set_exception(std::exception_ptr error) const {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard lock(state_->mutex);
    DDPRUN_CHECK(!state_->done, "Future completed twice");
    state_->error = std::move(error);
    state_->done = true;
    callbacks.swap(state_->callbacks);
  }
  state_->cv.notify_all();
  for (auto& cb : callbacks) cb();
}

std::vector<Value> wait_all(const std::vector<Future>& futures) {
  std::vector<Value> out;
  std::exception_ptr first;
  for (const auto& f : futures) {
    try {
      out.push_back(f.wait());
    } catch (...) {
      if (!first) first = std::current_exception();
      out.emplace_back();
    }
  }
  if (first) std::rethrow_exception(first);
  return out;
}

Future detail::readyFuture(Value value) {
  Future f;
  f.set_result(std::move(value));
  return f;
}

}  // namespace ddprun::rpc
