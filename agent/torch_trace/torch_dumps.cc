#include "agent/torch_trace/torch_dumps.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <new>
#include <thread>

#include <fmt/format.h>

#include "common/env_names.h"

namespace ddprun::agent {

// One thread reads the dumps handed to it, in order; results come back through done_. Nothing
// is thrown across: a dump that cannot be read comes back as its error. The destructor sets
// stop_, which the reader sees within some thousands of opcodes (PickleLimits::cancel), and
// joins, so no thread outlives the TorchDumps.
class TorchDumps::Reads {
 public:
  struct Done {
    size_t slot = 0;
    std::optional<FlightDump> dump;
    std::string error;
  };

  explicit Reads(DumpReader reader) : reader_(std::move(reader)), thread_([this] { loop(); }) {}
  ~Reads() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    stop_.notify_all();  // a reader that blocks on the cancel flag itself (the tests' stand-in)
    cv_.notify_all();
    thread_.join();
  }

  void submit(size_t slot, std::string path, int rank) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(Request{slot, std::move(path), rank});
      ++in_flight_;
    }
    cv_.notify_all();
  }
  // The reads that finished since the last call.
  std::vector<Done> take() {
    std::lock_guard lock(mu_);
    std::vector<Done> done;
    done.swap(done_);
    return done;
  }
  // Waits until nothing is queued or being read, at most `limit`.
  bool waitIdle(std::chrono::milliseconds limit) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, limit, [this] { return in_flight_ == 0; });
  }

 private:
  struct Request {
    size_t slot;
    std::string path;
    int rank;
  };

  void loop() {
    PickleLimits limits;
    limits.cancel = &stop_;
    for (;;) {
      Request request;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        request = std::move(queue_.front());
        queue_.pop_front();
      }
      Done done;
      done.slot = request.slot;
      try {
        done.dump = reader_(request.path, request.rank, limits);
      } catch (const FlightDumpError& e) {
        done.error = e.what();
      } catch (const std::bad_alloc&) {
        done.error = request.path + ": out of memory while reading it";
      } catch (const std::exception& e) {
        done.error = request.path + ": " + e.what();
      }
      {
        std::lock_guard lock(mu_);
        done_.push_back(std::move(done));
        --in_flight_;
      }
      cv_.notify_all();
    }
  }

  DumpReader reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request> queue_;      // guarded by mu_
  std::vector<Done> done_;         // guarded by mu_
  size_t in_flight_ = 0;           // queued or being read; guarded by mu_
  std::atomic<bool> stop_{false};  // set under mu_; read by the reader without it
  std::thread thread_;             // last: it starts once the members above exist
};

FileStamp stampOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return FileStamp{true, static_cast<uintmax_t>(st.st_size),
                   static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
                   static_cast<uint64_t>(st.st_ino)};
}

std::string torchDumpPrefix(const std::map<std::string, std::string>& env) {
  for (const char* name : {env::kTorchFrDumpTempFile, env::kTorchNcclDebugInfoTempFile}) {
    auto it = env.find(name);
    if (it != env.end() && !it->second.empty()) return it->second;
  }
  return {};
}

TorchDumps::TorchDumps(std::vector<ExpectedDump> expected, DumpReader reader) : reader_(std::move(reader)) {
  std::sort(expected.begin(), expected.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  for (ExpectedDump& e : expected) {
    Slot slot;
    slot.expected = std::move(e);
    slots_.push_back(std::move(slot));
  }
}

std::optional<int> TorchDumps::written() const {
  for (const Slot& s : slots_) {
    if (s.written) return s.expected.rank;
    const FileStamp now = stampOf(s.expected.path);
    if (now.exists && now != s.expected.before) return s.expected.rank;
  }
  return std::nullopt;
}

TorchDumps::~TorchDumps() = default;

void TorchDumps::take() {
  if (!reads_) return;
  for (Reads::Done& done : reads_->take()) {
    Slot& s = slots_[done.slot];
    s.reading = false;
    s.dump = std::move(done.dump);
    s.error = std::move(done.error);
  }
}

bool TorchDumps::waitForReads(std::chrono::milliseconds limit) {
  const bool idle = !reads_ || reads_->waitIdle(limit);
  take();
  return idle;
}

bool TorchDumps::poll() {
  take();
  bool settled = true;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.dump) continue;
    if (s.reading) {
      settled = false;
      continue;
    }
    const FileStamp now = stampOf(s.expected.path);
    if (!s.written) s.written = now.exists && now != s.expected.before;
    if (!s.written) {
      settled = false;
      continue;
    }
    // torch writes the file in place: read it once two looks found the same size.
    const bool holds = s.seen && now.size == s.seen_size;
    s.seen = true;
    s.seen_size = now.size;
    if (!holds || now.size == 0) {
      settled = false;
      continue;
    }
    if (s.tried && s.tried_size == now.size) continue;  // unreadable at this size already
    s.tried = true;
    s.tried_size = now.size;
    s.mtime_ns = now.mtime_ns;
    s.error.clear();
    s.reading = true;
    settled = false;
    if (!reads_) reads_ = std::make_unique<Reads>(reader_);
    reads_->submit(i, s.expected.path, s.expected.rank);
  }
  return settled;
}

std::vector<int> TorchDumps::writtenRanks() const {
  std::vector<int> ranks;
  for (const Slot& s : slots_) {
    if (s.written) ranks.push_back(s.expected.rank);
  }
  return ranks;
}

std::vector<FlightDump> TorchDumps::dumps() const {
  std::vector<FlightDump> dumps;
  for (const Slot& s : slots_) {
    if (s.dump) dumps.push_back(*s.dump);
  }
  return dumps;
}

std::vector<int> TorchDumps::missing() const {
  std::vector<int> ranks;
  for (const Slot& s : slots_) {
    if (!s.written) ranks.push_back(s.expected.rank);
  }
  return ranks;
}

std::vector<std::string> TorchDumps::unreadable() const {
  std::vector<std::string> lines;
  for (const Slot& s : slots_) {
    if (s.written && !s.dump) {
      const char* state = s.reading ? ": still being read" : ": still being written";
      lines.push_back(fmt::format("rank {}: {}", s.expected.rank, s.error.empty() ? s.expected.path + state : s.error));
    }
  }
  return lines;
}

int64_t TorchDumps::newestNs() const {
  int64_t newest = 0;
  for (const Slot& s : slots_) {
    if (s.dump) newest = std::max(newest, s.mtime_ns);
  }
  return newest;
}

}  // namespace ddprun::agent
