// The agent's worker threads: they run incoming calls (registered functions may block and
// make nested calls), Future::then() continuations and background RRef releases, in the
// order they were posted, as many at once as there are threads.
//
// Thread-safety: post() is thread-safe and never blocks. stop() lets the threads finish
// the task each is running and drops the tasks still queued; it joins every thread but
// the calling one (a task may stop the pool it runs on). An exception a task throws is
// logged and dropped.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ddprun::rpc::detail {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool() { stop(); }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void post(std::function<void()> fn);
  void stop();

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
};

}  // namespace ddprun::rpc::detail
