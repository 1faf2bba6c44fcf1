#include "worker_runtime/backend/host_backend.h"

#include <poll.h>
#include <unistd.h>

#include <fstream>

#include <fmt/format.h>

#include "common/env_names.h"
#include "common/env_reader.h"
#include "common/logging.h"

namespace ddprun::runtime {

namespace {

// One of the group's two recorders (off when the options say so; then the environment is not read).
FlightRecorder recorderOf(const HostBackendOptions& options, int rank, int size, FlightRingKind kind) {
  if (!options.flight_recorder) return FlightRecorder();
  return FlightRecorder::fromEnvironment(options.flight_rank >= 0 ? options.flight_rank : rank, options.flight_group,
                                         rank, size, kind);
}

}  // namespace

HostBackend::HostBackend(rendezvous::Store& store, const std::string& prefix, int rank, int size,
                         const std::string& address, std::chrono::milliseconds timeout,
                         const HostBackendOptions& options)
    : timeout_(timeout),
      options_(options),
      mesh_(store, prefix, rank, size, address, timeout),
      p2p_(mesh_, recorderOf(options, rank, size, FlightRingKind::kPointToPoint)) {
  if (options_.shared_memory != HostBackendOptions::SharedMemory::kOff) setUpSharedMemory(store, prefix);
  recorder_ = recorderOf(options_, rank, size, FlightRingKind::kCollective);
  thread_ = std::thread([this] { loop(); });
}

namespace {

// The same kernel instance: ranks with equal host names and boot ids share /dev/shm.
std::string hostIdentity() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  return std::string(host) + "/" + boot_id;
}

}  // namespace

void HostBackend::setUpSharedMemory(rendezvous::Store& store, const std::string& prefix) {
  // Read whatever the group's size, so a malformed value is reported on every run.
  const bool allowed = env::booleanOr(env::kShm, true);
  const int n = mesh_.size();
  if (n < 2 || !allowed) return;
  store.set(prefix + "host/" + std::to_string(mesh_.rank()), hostIdentity());
  std::vector<std::string> keys;
  for (int q = 0; q < n; ++q) keys.push_back(prefix + "host/" + std::to_string(q));
  auto hosts = store.multiGet(keys);
  for (const auto& h : hosts) {
    if (h != hosts[0]) return;  // not all on one host: TCP only
  }
  auto gone = [this](int q) {
    pollfd pfd{mesh_.fd(q, Channel::kCollective), POLLRDHUP, 0};
    return ::poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  };
  auto name = [this](int q) { return fmt::format("rank {} ({})", q, mesh_.peerAddress(q)); };
  try {
    shm_ =
        std::make_unique<ShmCollectives>(store, prefix, mesh_.rank(), n, timeout_, gone, name, options_.shm_slot_bytes);
    shm_links_ =
        std::make_unique<ShmLinks>(store, prefix, mesh_.rank(), n, timeout_, gone, name, options_.shm_ring_bytes);
  } catch (const DdprunError& e) {
    // Both or neither: the segments are made collectively, so every rank lands here alike.
    shm_.reset();
    shm_links_.reset();
    logger("runtime")->debug("shared memory unavailable, collectives use TCP: {}", e.what());
  }
}

HostBackend::~HostBackend() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    state_.fetch_or(kBusy, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  thread_.join();
}

void HostBackend::push(std::function<void(CollectiveContext&)> collective, const WorkPtr& work,
                       const FlightOpInfo& info) {
  const uint32_t before = state_.fetch_or(kBusy, std::memory_order_acq_rel);
  queue_.push_back(Queued{std::move(collective), work, info});
  // Once kBusy is set no op can start inline; one already running owns the recorder and
  // records this op when it ends (release()).
  if ((before & kInline) == 0) record(queue_.back());
}

void HostBackend::record(Queued& q) {
  q.seq = recorder_.enqueue(q.info);
  q.recorded = true;
}

WorkPtr HostBackend::enqueue(std::function<void(CollectiveContext&)> collective, const FlightOpInfo& info) {
  auto work = std::make_shared<Work>();
  {
    std::lock_guard lock(mutex_);
    push(std::move(collective), work, info);
  }
  wake_.notify_one();
  return work;
}

CollectiveContext HostBackend::context(Clock::time_point start) {
  Links& links = shm_links_ ? static_cast<Links&>(*shm_links_) : static_cast<Links&>(mesh_);
  return CollectiveContext{{links, start + timeout_, scratch_, options_.collectives}, shm_.get()};
}

std::exception_ptr HostBackend::execute(const std::function<void(CollectiveContext&)>& collective,
                                        std::exception_ptr broken) {
  if (broken) return broken;
  try {
    CollectiveContext ctx = context(coarseNow());
    collective(ctx);
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

void HostBackend::finish(uint64_t seq, const std::exception_ptr& error) {
  if (error && !broken_) broken_ = error;
  recorder_.finish(seq, !error);
}

bool HostBackend::claim(const FlightOpInfo& info, Clock::time_point now, uint64_t& seq, std::exception_ptr& error) {
  uint32_t idle = 0;
  // Acquires what the last op (inline or queued) left: broken_, the recorder, the links.
  if (!state_.compare_exchange_strong(idle, kInline, std::memory_order_acquire)) return false;
  error = broken_;
  if (error) {
    seq = recorder_.enqueue(info);  // never started: the group broke before it
  } else {
    seq = recorder_.enqueueStarted(
        info, std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count());
  }
  return true;
}

void HostBackend::release(uint64_t seq, const std::exception_ptr& error) {
  finish(seq, error);
  uint32_t inline_only = kInline;
  if (state_.compare_exchange_strong(inline_only, 0, std::memory_order_release)) return;
  // Ops were queued meanwhile (kBusy): record them, in order, and hand the group over.
  {
    std::lock_guard lock(mutex_);
    for (auto& q : queue_) {
      if (!q.recorded) record(q);
    }
    state_.fetch_and(~kInline, std::memory_order_release);
  }
  wake_.notify_one();
}

WorkPtr HostBackend::runQueued(std::function<void(CollectiveContext&)> collective, const FlightOpInfo& info) {
  auto work = std::make_shared<Work>();
  {
    std::lock_guard lock(mutex_);
    push(std::move(collective), work, info);
  }
  wake_.notify_one();
  work->wait();
  return work;
}

void HostBackend::loop() {
  for (;;) {
    std::function<void(CollectiveContext&)> task;
    WorkPtr work;
    uint64_t seq = 0;
    std::exception_ptr broken;
    {
      std::unique_lock lock(mutex_);
      // Not while an op runs inline: it owns the group (and maybe this op's record) until
      // its release() clears kInline and wakes this thread.
      wake_.wait(lock, [this] {
        const bool inline_op = (state_.load(std::memory_order_acquire) & kInline) != 0;
        return (!queue_.empty() && !inline_op) || (stopping_ && queue_.empty());
      });
      if (queue_.empty()) return;
      task = std::move(queue_.front().collective);
      work = std::move(queue_.front().work);
      seq = queue_.front().seq;
      queue_.pop_front();
      broken = broken_;
      if (!broken) recorder_.start(seq);
    }
    const std::exception_ptr error = execute(task, broken);
    // The ring's state is set before the Work completes: a waiter that goes on to the next
    // operation never finds this one still "started".
    {
      std::lock_guard lock(mutex_);
      finish(seq, error);
      // Nothing left: synchronous calls may run inline again.
      if (queue_.empty() && !stopping_) state_.fetch_and(~kBusy, std::memory_order_release);
    }
    work->complete(error);
  }
}

}  // namespace ddprun::runtime
