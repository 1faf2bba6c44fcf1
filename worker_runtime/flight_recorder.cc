#include "worker_runtime/flight_recorder.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/env_names.h"
#include "common/env_reader.h"
#include "common/logging.h"
#include "common/unique_fd.h"

namespace ddprun::runtime {

namespace {

// The coarse monotonic clock: the same time base as steady_clock (CLOCK_MONOTONIC), which the
// agent reads, at a few nanoseconds a call instead of ~25 (it reads the kernel's last tick
// instead of the TSC). Its resolution, a tick (1-4 ms), is far finer than any hang's.
int64_t nowNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

}  // namespace

FlightRecorder::FlightRecorder(const std::string& dir, int rank, int group, int group_rank, int group_size,
                               FlightRingKind kind, uint32_t capacity)
    : bytes_(flightRingBytes(capacity)) {
  if (!dir.empty()) {
    const std::string path = dir + "/" + flightRingFileName(rank, group, kind);
    // A restarted worker takes over the same name: truncating first zeroes the old ring.
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    void* m = MAP_FAILED;
    if (fd && ::ftruncate(fd.get(), static_cast<off_t>(bytes_)) == 0) {
      m = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    }
    if (m != MAP_FAILED) {
      memory_ = m;
      mapped_ = true;
      path_ = path;
    } else {
      logger("runtime")->warn("flight recorder ring {}: {}; the agent will not see this group's operations", path,
                              std::strerror(errno));
    }
  }
  if (!memory_) {
    memory_ = std::aligned_alloc(64, bytes_);
    std::memset(memory_, 0, bytes_);
  }
  writer_ = FlightRingWriter(memory_, capacity, rank, group, group_rank, group_size, kind);
}

FlightRecorder FlightRecorder::fromEnvironment(int rank, int group, int group_rank, int group_size,
                                               FlightRingKind kind) {
  if (!env::booleanOr(env::kFlightRecorder, true)) return FlightRecorder();
  return FlightRecorder(env::stringOr(env::kFlightDir, ""), rank, group, group_rank, group_size, kind);
}

FlightRecorder::~FlightRecorder() { release(); }

FlightRecorder::FlightRecorder(FlightRecorder&& other) noexcept
    : memory_(std::exchange(other.memory_, nullptr)),
      bytes_(other.bytes_),
      mapped_(other.mapped_),
      path_(std::move(other.path_)),
      writer_(std::move(other.writer_)) {}

FlightRecorder& FlightRecorder::operator=(FlightRecorder&& other) noexcept {
  if (this != &other) {
    release();
    memory_ = std::exchange(other.memory_, nullptr);
    bytes_ = other.bytes_;
    mapped_ = other.mapped_;
    path_ = std::move(other.path_);
    writer_ = std::move(other.writer_);
  }
  return *this;
}

void FlightRecorder::release() {
  if (!memory_) return;
  // The file stays: the agent reads it after this process is gone, and removes it.
  if (mapped_) {
    ::munmap(memory_, bytes_);
  } else {
    std::free(memory_);
  }
  memory_ = nullptr;
}

uint64_t FlightRecorder::enqueue(const FlightOpInfo& info) { return memory_ ? writer_.enqueue(info, nowNs()) : 0; }

uint64_t FlightRecorder::enqueueStarted(const FlightOpInfo& info, int64_t now_ns) {
  return memory_ ? writer_.enqueueStarted(info, now_ns) : 0;
}

void FlightRecorder::start(uint64_t seq) {
  if (memory_) writer_.start(seq, nowNs());
}

void FlightRecorder::finish(uint64_t seq, bool ok) {
  if (memory_) writer_.finish(seq, ok, nowNs());
}

}  // namespace ddprun::runtime
