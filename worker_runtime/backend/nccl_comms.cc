// The NCCL backend's communicators (nccl_tensor_backend_impl.h): made on the first op (the id
// through the store) or split from the parent group's, every call on them settled (they are
// non-blocking), and torn down once the peers are done; the factories of
// nccl_tensor_backend.h.
#include "worker_runtime/backend/nccl_tensor_backend.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstring>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "worker_runtime/backend/nccl_tensor_backend_impl.h"
#include "worker_runtime/peer_error.h"

namespace ddprun::dist {
namespace nccl {

// A call on a non-blocking communicator settled: ncclInProgress waited out until `deadline`
// (still ncclInProgress when it passed), or until `stop` is set.
ncclResult_t settled(ncclComm_t comm, ncclResult_t result, Clock::time_point deadline, const std::atomic<bool>* stop) {
  while (result == ncclInProgress && Clock::now() < deadline && !(stop && stop->load(std::memory_order_acquire))) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    ncclCommGetAsyncError(comm, &result);
  }
  return result;
}

void NcclTensorBackend::adopt(ncclComm_t comm, c10::Device device) {
  comm_ = comm;
  device_ = device;
  stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index());
  watchdog_ = std::thread([this] { watchdog(); });
}

void NcclTensorBackend::makeComm(c10::Device device) {
  c10::cuda::CUDAGuard guard(device);
  const auto deadline = Clock::now() + group_.timeout;
  // The id travels through the store under a key rank 0 deletes once every rank has it, so a
  // later group with the same prefix (a new init_process_group) never reads a stale one.
  ncclUniqueId id;
  const std::string key = group_.prefix + "nccl/unique_id";
  const std::string taken = key + "/taken";
  if (group_.rank == 0) {
    if (ncclGetUniqueId(&id) != ncclSuccess) throw DdprunError("ncclGetUniqueId failed");
    if (group_.size > 1) {
      group_.store->set(key, std::string(reinterpret_cast<const char*>(&id), sizeof id));
      group_.store->wait({taken + "/all"}, group_.timeout);
      group_.store->deleteKey(key);
      group_.store->deleteKey(taken);
      group_.store->deleteKey(taken + "/all");
    }
  } else {
    const std::string bytes = group_.store->get(key);
    if (bytes.size() != sizeof id) throw DdprunError("the NCCL unique id from the store has the wrong size");
    std::memcpy(&id, bytes.data(), sizeof id);
    if (group_.store->add(taken, 1) == group_.size - 1) group_.store->set(taken + "/all", "1");
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // initialisation and every call can be watched, and aborted on a timeout
  ncclComm_t comm = nullptr;
  const ncclResult_t result = ncclCommInitRankConfig(&comm, group_.size, id, group_.rank, &config);
  comm_ = comm;
  device_ = device;
  check(result, "NCCL communicator initialisation", deadline);
  adopt(comm, device);
}

void NcclTensorBackend::check(ncclResult_t result, const char* what, Clock::time_point deadline) {
  // A call can return ncclSuccess while its work goes on in NCCL's own thread (NCCL 2.28's
  // ncclCommSplit drops its group's ncclInProgress; seen on an H200): the communicator's state,
  // in progress until that work is done, says when it is (one atomic read when it is).
  if (result == ncclSuccess && comm_) ncclCommGetAsyncError(comm_, &result);
  result = settled(comm_, result, deadline, &breaking_);
  // Broken meanwhile (by the watchdog): that error, not this call's state.
  if (breaking_.load(std::memory_order_acquire)) throwIfBroken();
  if (result == ncclInProgress) {
    std::rethrow_exception(breakGroup(
        fmt::format("{} ({}): not done within {} ms; a peer is gone or hung", what, where(), group_.timeout.count())));
  }
  if (result == ncclSuccess) return;
  const std::string message = fmt::format("{} ({}): NCCL error: {}{}", what, where(), ncclGetErrorString(result),
                                          result == ncclInvalidArgument || result == ncclInvalidUsage
                                              ? std::string()
                                              : std::string("; ") + ncclGetLastError(comm_));
  if (result == ncclInvalidArgument || result == ncclInvalidUsage) throw DdprunError(message);
  std::rethrow_exception(breakGroup(message));
}

void NcclTensorBackend::throwIfBroken() {
  std::lock_guard lock(mutex_);
  if (broken_) std::rethrow_exception(broken_);
}

NcclTensorBackend::~NcclTensorBackend() {
  if (watchdog_.joinable()) {
    // Ops still on the GPU finish first (up to the timeout), so aborting cannot cut them off.
    const auto deadline = Clock::now() + group_.timeout;
    while (Clock::now() < deadline) {
      {
        std::lock_guard lock(mutex_);
        std::string cuda_error;
        if (broken_ || pending_.empty() || eventFired(*pending_.back(), cuda_error) || !cuda_error.empty()) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    watchdog_.join();
    waitForPeers();
  }
  // Aborting never blocks, where destroying waits for peers that may be gone.
  if (comm_) abortOnce();
}

void NcclTensorBackend::waitForPeers() {
  uint64_t mine = 0;
  {
    std::lock_guard lock(mutex_);
    if (broken_ || !comm_ || group_.size < 2) return;
    mine = next_seq_ - 1;
  }
  if (mine == 0) return;
  const auto wait = std::min<std::chrono::milliseconds>(group_.timeout, kPeerTeardownWait);
  const auto deadline = Clock::now() + wait;
  try {
    group_.store->set(progressKey(group_.rank), std::to_string(mine));
    for (int q = 0; q < group_.size; ++q) {
      if (q == group_.rank) continue;
      for (;;) {
        if (group_.store->check({progressKey(q)}) && std::stoull(group_.store->get(progressKey(q))) >= mine) break;
        if (Clock::now() > deadline) {
          spdlog::warn("NCCL teardown ({}): rank {} has not completed op #{} after {} s; aborting the communicator",
                       where(), q, mine, wait.count() / 1000.0);
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  } catch (const std::exception& e) {
    // The store went first (its host rank ended): nothing left to wait for.
    spdlog::debug("NCCL teardown ({}): the peers' progress is unknown: {}", where(), e.what());
  }
}

}  // namespace nccl

using nccl::Clock;
using nccl::kCanSplit;
using nccl::NcclTensorBackend;
using nccl::settled;

bool ncclViable(std::string* why) {
  if (c10::cuda::device_count() > 0) return true;
  if (why) *why = "no CUDA device is visible";
  return false;
}

std::unique_ptr<Backend> makeNcclBackend(const NcclGroup& group) {
  std::string why;
  if (!ncclViable(&why)) throw DdprunError("backend nccl is not viable here: " + why);
  return std::make_unique<NcclTensorBackend>(group);
}

std::unique_ptr<Backend> splitNcclBackend(Backend* parent, const NcclGroup& group, bool member) {
  auto* nccl = dynamic_cast<NcclTensorBackend*>(parent);
  if (!kCanSplit || !nccl || !nccl->comm()) return member ? makeNcclBackend(group) : nullptr;
  // Every rank of the parent takes part; ranks outside the new group pass no color.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  // NCCL's thread writes the new communicator here once the split is done. On the heap, and
  // left allocated where this gives up early, so that a late write still lands in live memory.
  auto* slot = new ncclComm_t(nullptr);
  c10::cuda::CUDAGuard guard(nccl->device());
  nccl->call("ncclCommSplit", [&] {
    return ncclCommSplit(nccl->comm(), member ? 0 : NCCL_SPLIT_NOCOLOR, member ? group.rank : 0, slot, &config);
  });
  // call() waited until the parent's state left ncclInProgress: the split's work is over.
  if (!member) {
    delete slot;
    return nullptr;
  }
  const auto deadline = Clock::now() + group.timeout;
  ncclComm_t child = nullptr;
  while ((child = __atomic_load_n(slot, __ATOMIC_ACQUIRE)) == nullptr && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  if (child == nullptr) {
    throw runtime::PeerError(
        fmt::format("new_group: ncclCommSplit handed over no communicator within {} ms", group.timeout.count()));
  }
  delete slot;
  // The child is non-blocking too: settle its own initialisation.
  ncclResult_t state = ncclSuccess;
  ncclCommGetAsyncError(child, &state);
  state = settled(child, state, Clock::now() + group.timeout);
  if (state != ncclSuccess) {
    ncclCommAbort(child);
    throw runtime::PeerError(fmt::format("new_group: ncclCommSplit: {}", state == ncclInProgress
                                                                             ? std::string("timed out")
                                                                             : ncclGetErrorString(state)));
  }
  return std::make_unique<NcclTensorBackend>(group, child, nccl->device());
}

}  // namespace ddprun::dist
