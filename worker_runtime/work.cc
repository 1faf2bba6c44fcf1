#include "worker_runtime/work.h"

namespace ddprun::runtime {

std::shared_ptr<Work> Work::completed(std::exception_ptr error) {
  // Every successful inline op returns the same finished Work: nothing about it can change
  // any more, and making one (a mutex, a condition variable, an allocation) was a fifth of a
  // small collective's own cost. Held by a pointer without a control block (shared_ptr's
  // aliasing constructor on an empty owner), so handing it out and dropping it touch no
  // reference count; never freed, so no WorkPtr can outlive it, even at exit.
  static const std::shared_ptr<Work> success = [] {
    auto* work = new Work();
    work->done_.store(true, std::memory_order_release);
    return std::shared_ptr<Work>(std::shared_ptr<Work>(), work);
  }();
  if (!error) return success;
  auto work = std::make_shared<Work>();
  work->error_ = std::move(error);
  work->done_.store(true, std::memory_order_release);
  return work;
}

bool Work::isCompleted() const { return done_.load(std::memory_order_acquire); }

bool Work::isSuccess() const { return done_.load(std::memory_order_acquire) && !error_; }

void Work::wait() {
  if (!done_.load(std::memory_order_acquire)) {
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [this] { return done_.load(std::memory_order_relaxed); });
  }
  if (error_) std::rethrow_exception(error_);
}

void Work::complete(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    error_ = std::move(error);
    done_.store(true, std::memory_order_release);
  }
  done_cv_.notify_all();
}

}  // namespace ddprun::runtime
