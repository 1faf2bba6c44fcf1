// The handle of an asynchronous operation, like torch's Work: wait() blocks until it is
// done and rethrows its failure there (nothing is thrown across threads). A device backend
// derives from it: its wait() orders the caller's stream instead of blocking the host.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

namespace ddprun::runtime {

class Work {
 public:
  virtual ~Work() = default;

  // A Work already done: what an operation that ran on the caller's thread returns.
  static std::shared_ptr<Work> completed(std::exception_ptr error);

  // True once the operation finished, successfully or not. Thread-safe, never blocks.
  virtual bool isCompleted() const;
  // True once it finished without error.
  virtual bool isSuccess() const;
  // Blocks until done; rethrows the operation's exception (PeerError, ...). Thread-safe.
  virtual void wait();
  // Marks the operation done (called once, by whoever ran it).
  void complete(std::exception_ptr error = nullptr);

 protected:
  // The failure complete() recorded, once isCompleted() of this class is true (else null).
  std::exception_ptr failure() const { return done_.load(std::memory_order_acquire) ? error_ : nullptr; }

 private:
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  // Set once, after error_, under mutex_ (for wait()'s condition variable); read without it
  // by the checks of a finished Work, so waiting on one costs no lock.
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace ddprun::runtime
