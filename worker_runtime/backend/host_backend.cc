#include "worker_runtime/backend/host_backend.h"

namespace ddprun::runtime {

HostBackend::HostBackend(rendezvous::Store& store, const std::string& prefix, int rank, int size,
                         const std::string& address, std::chrono::milliseconds timeout)
    : timeout_(timeout), mesh_(store, prefix, rank, size, address, timeout), p2p_(mesh_) {
  thread_ = std::thread([this] { run(); });
}

HostBackend::~HostBackend() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

WorkPtr HostBackend::enqueue(std::function<void(CollectiveContext&)> collective) {
  auto work = std::make_shared<Work>();
  {
    std::lock_guard lock(mutex_);
    queue_.emplace_back(std::move(collective), work);
  }
  wake_.notify_one();
  return work;
}

void HostBackend::run() {
  for (;;) {
    std::function<void(CollectiveContext&)> task;
    WorkPtr work;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front().first);
      work = std::move(queue_.front().second);
      queue_.pop_front();
    }
    if (broken_) {
      work->complete(broken_);
      continue;
    }
    try {
      CollectiveContext ctx{mesh_, Clock::now() + timeout_, scratch_};
      task(ctx);
      work->complete();
    } catch (...) {
      broken_ = std::current_exception();
      work->complete(broken_);
    }
  }
}

}  // namespace ddprun::runtime
