#include "tests/runtime/support/thread_ranks.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace ddprun::testing {

RankFailure::RankFailure(int rank, const std::string& what)
    : std::runtime_error(fmt::format("rank {}: {}", rank, what)), rank_(rank) {}

namespace {

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// What the ranks of one run share: who is still running, and the first failure.
class Outcome {
 public:
  explicit Outcome(int world_size) : running_(world_size, true) {}

  void fail(int rank, const std::exception_ptr& error) {
    std::lock_guard lock(mutex_);
    if (!first_) first_.emplace(rank, describe(error));
  }

  void finished(int rank) {
    {
      std::lock_guard lock(mutex_);
      running_[rank] = false;
    }
    done_.notify_all();
  }

  // Waits for every rank; past `limit`, reports the ranks still running and ends the process.
  void waitOrDie(std::chrono::seconds limit) {
    std::unique_lock lock(mutex_);
    auto all_done = [this] { return std::find(running_.begin(), running_.end(), true) == running_.end(); };
    if (done_.wait_for(lock, limit, all_done)) return;
    std::string stuck;
    for (size_t r = 0; r < running_.size(); ++r) {
      if (running_[r]) stuck += (stuck.empty() ? "" : ", ") + std::to_string(r);
    }
    std::fprintf(stderr, "thread ranks: rank(s) %s still running after %llds (watchdog); first failure: %s\n",
                 stuck.c_str(), static_cast<long long>(limit.count()), first_ ? first_->what() : "none");
    std::fflush(stderr);
    std::_Exit(1);
  }

  void rethrowFirst() {
    std::lock_guard lock(mutex_);
    if (first_) throw *first_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::vector<bool> running_;
  std::optional<RankFailure> first_;
};

void runGroup(int world_size, const std::function<void(int, rendezvous::Store&, Outcome&)>& body,
              std::chrono::seconds watchdog) {
  rendezvous::InMemoryStore store(kRankOpTimeout);
  Outcome outcome(world_size);
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank, store, outcome);
      } catch (...) {
        outcome.fail(rank, std::current_exception());
      }
      outcome.finished(rank);
    });
  }
  outcome.waitOrDie(watchdog);
  for (auto& t : threads) t.join();
  outcome.rethrowFirst();
}

}  // namespace

void runThreads(int world_size, const std::function<void(int rank, rendezvous::Store& store)>& body,
                std::chrono::seconds watchdog) {
  runGroup(
      world_size, [&](int rank, rendezvous::Store& store, Outcome&) { body(rank, store); }, watchdog);
}

void runRanks(int world_size, const runtime::HostBackendOptions& options,
              const std::function<void(runtime::HostBackend& backend)>& body, std::chrono::seconds watchdog) {
  runGroup(
      world_size,
      [&](int rank, rendezvous::Store& store, Outcome& outcome) {
        auto backend = std::make_unique<runtime::HostBackend>(store, "pg/", rank, world_size, "127.0.0.1",
                                                              kRankOpTimeout, options);
        bool failed = false;
        try {
          body(*backend);
        } catch (...) {
          // Recorded before the backend goes: its peers' errors about it come later.
          outcome.fail(rank, std::current_exception());
          failed = true;
        }
        // A rank that failed leaves at once, so its peers fail fast; one that succeeded waits
        // for the others first, so it never closes a transport a peer still reads from.
        if (failed) backend.reset();
        if (store.add("done", 1) == world_size) store.set("all_done", "1");
        store.wait({"all_done"}, kRankOpTimeout);
      },
      watchdog);
}

}  // namespace ddprun::testing
