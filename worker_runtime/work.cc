#include "worker_runtime/work.h"

namespace ddprun::runtime {

bool Work::isCompleted() const {
  std::lock_guard lock(mutex_);
  return done_;
}

bool Work::isSuccess() const {
  std::lock_guard lock(mutex_);
  return done_ && !error_;
}

void Work::wait() {
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [this] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

void Work::complete(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    error_ = std::move(error);
  }
  done_cv_.notify_all();
}

}  // namespace ddprun::runtime
