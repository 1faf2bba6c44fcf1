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
  }
  wake_.notify_all();
  thread_.join();
}

WorkPtr HostBackend::enqueue(std::function<void(CollectiveContext&)> collective, const FlightOpInfo& info) {
  auto work = std::make_shared<Work>();
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(Queued{std::move(collective), work, recorder_.enqueue(info)});
  }
  wake_.notify_one();
  return work;
}

CollectiveContext HostBackend::context() {
  Links& links = shm_links_ ? static_cast<Links&>(*shm_links_) : static_cast<Links&>(mesh_);
  return CollectiveContext{links, coarseNow() + timeout_, scratch_, shm_.get(), options_.collectives};
}

std::exception_ptr HostBackend::execute(const std::function<void(CollectiveContext&)>& collective,
                                        std::exception_ptr broken) {
  if (broken) return broken;
  try {
    CollectiveContext ctx = context();
    collective(ctx);
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

void HostBackend::finish(uint64_t seq, const std::exception_ptr& error) {
  if (error && !broken_) broken_ = error;
  recorder_.finish(seq, !error);
  running_ = false;
}

bool HostBackend::claim(const FlightOpInfo& info, uint64_t& seq, std::exception_ptr& error) {
  std::lock_guard lock(mutex_);
  if (running_ || !queue_.empty() || stopping_) return false;
  running_ = true;
  seq = recorder_.enqueue(info);
  error = broken_;
  if (!error) recorder_.start(seq);
  return true;
}

void HostBackend::release(uint64_t seq, const std::exception_ptr& error) {
  bool more = false;
  {
    std::lock_guard lock(mutex_);
    finish(seq, error);
    more = !queue_.empty();  // queued by other threads meanwhile
  }
  if (more) wake_.notify_one();
}

WorkPtr HostBackend::runQueued(std::function<void(CollectiveContext&)> collective, const FlightOpInfo& info) {
  auto work = std::make_shared<Work>();
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(Queued{std::move(collective), work, recorder_.enqueue(info)});
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
      wake_.wait(lock, [this] { return (!queue_.empty() && !running_) || (stopping_ && queue_.empty()); });
      if (queue_.empty()) return;
      task = std::move(queue_.front().collective);
      work = std::move(queue_.front().work);
      seq = queue_.front().seq;
      queue_.pop_front();
      running_ = true;
      broken = broken_;
      if (!broken) recorder_.start(seq);
    }
    const std::exception_ptr error = execute(task, broken);
    // The ring's state is set before the Work completes: a waiter that goes on to the next
    // operation never finds this one still "started".
    {
      std::lock_guard lock(mutex_);
      finish(seq, error);
    }
    work->complete(error);
  }
}

}  // namespace ddprun::runtime
