#include "worker_runtime/rpc/thread_pool.h"

#include <exception>

#include "worker_runtime/rpc/internal.h"

namespace ddprun::rpc::detail {

ThreadPool::ThreadPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
}

void ThreadPool::post(std::function<void()> fn) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

void ThreadPool::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
    if (t.joinable()) t.detach();
  }
  threads_.clear();
}

void ThreadPool::loop() {
  while (true) {
    std::function<void()> fn;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      fn();
    } catch (const std::exception& e) {
      rpcLog()->error("rpc worker thread: uncaught exception: {}", e.what());
    }
  }
}

}  // namespace ddprun::rpc::detail
