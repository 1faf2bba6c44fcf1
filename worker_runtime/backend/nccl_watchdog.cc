// The NCCL backend's watchdog (nccl_tensor_backend_impl.h): a thread per communicator that
// completes the ops the GPU is done with, publishes how far this rank got, and breaks the group
// on a timeout or an NCCL error, naming the ranks that are behind.
#include <cstdio>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "worker_runtime/backend/nccl_tensor_backend_impl.h"
#include "worker_runtime/error_record.h"
#include "worker_runtime/peer_error.h"

namespace ddprun::dist::nccl {

using runtime::PeerError;

std::exception_ptr NcclTensorBackend::breakGroup(const std::string& message) {
  std::deque<std::shared_ptr<NcclWork>> failed;
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
    if (broken_) return broken_;
    broken_ = std::make_exception_ptr(PeerError(message));
    error = broken_;
    failed.swap(pending_);
  }
  breaking_.store(true, std::memory_order_release);
  // Abort ends the communicator's kernels, so nothing queued after them waits forever. Not
  // under a call of the caller's thread, which would use the freed communicator (a survivor
  // crashed so on an H200): that call aborts it as it leaves (CallScope). Not at all when the
  // process ends here anyway.
  if (comm_ && !tear_down_) {
    std::unique_lock<std::mutex> caller;
    if (caller_.load(std::memory_order_relaxed) != std::this_thread::get_id()) {
      caller = std::unique_lock(launch_mutex_, std::try_to_lock);
    }
    if (caller.owns_lock()) {
      abortOnce();
    } else {
      abort_deferred_.store(true, std::memory_order_release);
    }
  }
  for (auto& w : failed) w->settle(error);
  spdlog::error("NCCL watchdog: {}", message);
  if (tear_down_) {
    // torch's default (TORCH_NCCL_ASYNC_ERROR_HANDLING=3): the process ends, so that no rank
    // goes on with results it never got; the launcher reports the message from the error file.
    runtime::writeErrorFile("NCCL watchdog: " + message, "");
    spdlog::default_logger()->flush();
    std::fflush(nullptr);
    std::_Exit(1);
  }
  return error;
}

std::string NcclTensorBackend::blame(uint64_t seq) {
  std::string behind;
  try {
    for (int q = 0; q < group_.size; ++q) {
      if (q == group_.rank) continue;
      if (!group_.store->check({progressKey(q)})) {
        behind += fmt::format("{}rank {} completed no op", behind.empty() ? "" : ", ", q);
        continue;
      }
      const uint64_t done = std::stoull(group_.store->get(progressKey(q)));
      if (done < seq) behind += fmt::format("{}rank {} completed only up to #{}", behind.empty() ? "" : ", ", q, done);
    }
  } catch (const std::exception& e) {
    return fmt::format("the ranks' progress is unknown ({})", e.what());
  }
  if (behind.empty()) return "every other rank got past it";
  return behind + ": gone or hung";
}

void NcclTensorBackend::watchdog() {
  uint64_t completed = 0, published = 0;
  auto last_publish = Clock::now();
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, std::chrono::milliseconds(50));
    if (broken_) continue;
    std::string failure;
    while (!pending_.empty()) {
      auto& w = pending_.front();
      std::string cuda_error;
      if (eventFired(*w, cuda_error)) {
        completed = w->seq();
        w->settle(nullptr);
        pending_.pop_front();
        continue;
      }
      if (!cuda_error.empty()) {
        failure = fmt::format("{} #{} ({}): CUDA error: {}", w->what(), w->seq(), where(), cuda_error);
        break;
      }
      if (Clock::now() - w->issued() > group_.timeout) {
        const uint64_t seq = w->seq();
        failure =
            fmt::format("{} #{} ({}) did not complete within {} ms", w->what(), seq, where(), group_.timeout.count());
        lock.unlock();  // the store may be slow; launch() must not wait for it
        failure += "; " + blame(seq);
        lock.lock();
      }
      break;
    }
    if (failure.empty()) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        const uint64_t seq = pending_.empty() ? completed + 1 : pending_.front()->seq();
        lock.unlock();
        failure = fmt::format("op #{} ({}): NCCL error: {}; {}", seq, where(), ncclGetErrorString(async), blame(seq));
        lock.lock();
      }
    }
    if (!failure.empty()) {
      lock.unlock();
      breakGroup(failure);
      lock.lock();
      continue;
    }
    // How far this rank got, for the others' watchdogs to name who is behind.
    if (completed != published && Clock::now() - last_publish > std::chrono::milliseconds(200)) {
      lock.unlock();
      try {
        group_.store->set(progressKey(group_.rank), std::to_string(completed));
        published = completed;
      } catch (const std::exception& e) {
        spdlog::warn("NCCL watchdog: cannot publish progress to the store: {}", e.what());
      }
      last_publish = Clock::now();
      lock.lock();
    }
  }
}

}  // namespace ddprun::dist::nccl
