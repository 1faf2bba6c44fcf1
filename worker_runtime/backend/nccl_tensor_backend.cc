#include "worker_runtime/backend/nccl_tensor_backend.h"

#include <nccl.h>
#include <unistd.h>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/env_reader.h"
#include "common/error.h"
#include "worker_runtime/error_record.h"
#include "worker_runtime/peer_error.h"

namespace ddprun::dist {
namespace {

using Clock = std::chrono::steady_clock;
using runtime::PeerError;

// ncclCommSplit appeared in NCCL 2.18; the 8-bit float types in 2.24.
constexpr bool kCanSplit = NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0);
// Ops of one communicator that may be unfinished on the GPU before the next waits. Unbounded,
// a caller that outruns the GPU fills CUDA's launch queue and then blocks inside a launch in
// NCCL; if a peer dies then, its kernel never ends, and the watchdog cannot abort the
// communicator under that call: a hang (seen on an H200, TORCH_NCCL_ASYNC_ERROR_HANDLING=0).
// With the bound, the caller waits here instead, outside NCCL, where it can be aborted. A few
// launches per op, so 64 stay well under a launch queue's 1024.
constexpr size_t kMaxInFlight = 64;

ncclDataType_t ncclTypeOf(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kChar: return ncclInt8;
    case at::kByte: return ncclUint8;
    case at::kBool: return ncclUint8;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kUInt32: return ncclUint32;
    case at::kUInt64: return ncclUint64;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case at::kFloat8_e4m3fn: return ncclFloat8e4m3;
    case at::kFloat8_e5m2: return ncclFloat8e5m2;
#endif
    default: throw DdprunError(fmt::format("{}: dtype {} has no NCCL type", what, c10::toString(t.scalar_type())));
  }
}

// Booleans reduce as torch's NCCL backend does: "sum" is or (max), "product" is and (min).
ncclRedOp_t ncclOpOf(ReduceOp op, const at::Tensor& t, const char* what) {
  const bool boolean = t.scalar_type() == at::kBool;
  switch (op) {
    case ReduceOp::SUM: return boolean ? ncclMax : ncclSum;
    case ReduceOp::PRODUCT: return boolean ? ncclMin : ncclProd;
    case ReduceOp::MIN: return ncclMin;
    case ReduceOp::MAX: return ncclMax;
    case ReduceOp::AVG:
      if (boolean) throw DdprunError(fmt::format("{}: AVG is not defined on bool tensors", what));
      return ncclAvg;
  }
  return ncclSum;
}

size_t bytesOf(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

// A call on a non-blocking communicator settled: ncclInProgress waited out until `deadline`
// (still ncclInProgress when it passed), or until `stop` is set.
ncclResult_t settled(ncclComm_t comm, ncclResult_t result, Clock::time_point deadline,
                     const std::atomic<bool>* stop = nullptr) {
  while (result == ncclInProgress && Clock::now() < deadline && !(stop && stop->load(std::memory_order_acquire))) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    ncclCommGetAsyncError(comm, &result);
  }
  return result;
}

// One op of the communicator: done when `end` (recorded on the communication stream after it)
// is, or failed by the watchdog.
class NcclWork final : public runtime::Work {
 public:
  NcclWork(std::string what, uint64_t seq, c10::Device device, bool blocks_host, std::vector<at::Tensor> keep)
      : what_(std::move(what)), seq_(seq), device_(device), blocks_host_(blocks_host), keep_(std::move(keep)) {}

  // Orders the caller's current stream after the op; barrier() also blocks the host until it
  // is done, as torch's does. Rethrows the watchdog's failure.
  void wait() override {
    if (blocks_host_) {
      while (!Work::isCompleted() && !end.query()) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    if (auto error = failure()) std::rethrow_exception(error);
    c10::cuda::CUDAGuard guard(device_);
    end.block(at::cuda::getCurrentCUDAStream(device_.index()));
  }
  bool isCompleted() const override { return Work::isCompleted() || end.query(); }
  bool isSuccess() const override { return isCompleted() && !failure(); }

  const std::string& what() const { return what_; }
  uint64_t seq() const { return seq_; }
  Clock::time_point issued() const { return issued_; }
  // The watchdog's: marks it done and lets go of its tensors.
  void settle(std::exception_ptr error) {
    keep_.clear();
    complete(std::move(error));
  }

  at::cuda::CUDAEvent end;

 private:
  std::string what_;
  uint64_t seq_;
  c10::Device device_;
  bool blocks_host_;
  Clock::time_point issued_ = Clock::now();
  std::vector<at::Tensor> keep_;  // alive until the GPU is done with them
};

// A tensor as NCCL sees it: contiguous. A non-contiguous one goes through a contiguous copy,
// made on the communication stream just before the op (load()) and written back there after
// it (finish()). Copied on the caller's stream instead, an op issued after an async one on the
// same tensor read it before the async op's result was written back (the caller's stream
// waits for the communication stream only in wait()).
struct Staged {
  at::Tensor user;
  at::Tensor buf;
  void load() {
    if (!buf.is_same(user)) buf.copy_(user);
  }
  void finish() {
    if (!buf.is_same(user)) user.copy_(buf);
  }
};

Staged stage(const at::Tensor& t) { return Staged{t, t.is_contiguous() ? t : at::empty(t.sizes(), t.options())}; }

class NcclTensorBackend final : public Backend {
 public:
  explicit NcclTensorBackend(NcclGroup group) : group_(std::move(group)) {
    const int mode = env::integerOr<int>("TORCH_NCCL_ASYNC_ERROR_HANDLING", 3, 0, 3);
    tear_down_ = mode == 1 || mode == 3;
  }
  // A communicator split from the parent's (members only).
  NcclTensorBackend(NcclGroup group, ncclComm_t comm, c10::Device device) : NcclTensorBackend(std::move(group)) {
    adopt(comm, device);
  }
  ~NcclTensorBackend() override;

  std::string_view name() const override { return "nccl"; }

  // For splitNcclBackend: the communicator, when made (null before the first op).
  ncclComm_t comm() const { return comm_; }
  c10::Device device() const { return device_; }
  // Runs an NCCL call that takes the communicator (ncclCommSplit) and settles it.
  void call(const char* what, const std::function<ncclResult_t()>& body) {
    CallScope scope(*this);
    throwIfBroken();
    // No wait for the communicator to be ready first: check() left it settled after its last op.
    check(body(), what, Clock::now() + group_.timeout);
  }

  WorkPtr broadcast(at::Tensor& tensor, int root, bool async_op) override {
    auto s = stage(tensor);
    return launch("broadcast", {s}, async_op, [&](cudaStream_t stream) {
      if (s.buf.numel() == 0) return ncclSuccess;  // the same on every rank: nothing to move
      return ncclBroadcast(s.buf.data_ptr(), s.buf.data_ptr(), s.buf.numel(), ncclTypeOf(s.buf, "broadcast"), root,
                           comm_, stream);
    });
  }

  WorkPtr allReduce(at::Tensor& tensor, ReduceOp op, bool async_op) override {
    auto s = stage(tensor);
    return launch("all_reduce", {s}, async_op, [&](cudaStream_t stream) {
      if (s.buf.numel() == 0) return ncclSuccess;
      return ncclAllReduce(s.buf.data_ptr(), s.buf.data_ptr(), s.buf.numel(), ncclTypeOf(s.buf, "all_reduce"),
                           opOf(op, s.buf, "all_reduce"), comm_, stream);
    });
  }

  WorkPtr reduce(at::Tensor& tensor, int root, ReduceOp op, bool async_op) override {
    auto s = stage(tensor);
    return launch("reduce", {s}, async_op, [&](cudaStream_t stream) {
      if (s.buf.numel() == 0) return ncclSuccess;
      return ncclReduce(s.buf.data_ptr(), s.buf.data_ptr(), s.buf.numel(), ncclTypeOf(s.buf, "reduce"),
                        opOf(op, s.buf, "reduce"), root, comm_, stream);
    });
  }

  WorkPtr allGather(std::vector<at::Tensor>& outputs, const at::Tensor& input, bool async_op) override {
    auto in = stage(input);
    std::vector<Staged> staged{in};
    for (auto& o : outputs) staged.push_back(Staged{o, o});
    // Into one flat buffer on the communication stream, then out to the caller's tensors there:
    // the copies only once the call has settled, since until then the non-blocking communicator
    // may not have queued the gather, and copies queued first would read the buffer unwritten.
    const int64_t n = input.numel();
    at::Tensor flat;
    return launch(
        "all_gather", staged, async_op,
        [&](cudaStream_t stream) {
          if (n == 0) return ncclSuccess;
          flat = at::empty({static_cast<int64_t>(outputs.size()) * n}, input.options());
          return ncclAllGather(in.buf.data_ptr(), flat.data_ptr(), n, ncclTypeOf(in.buf, "all_gather"), comm_, stream);
        },
        /*blocks_host=*/false,
        [&] {
          if (n == 0) return;
          for (size_t i = 0; i < outputs.size(); ++i) {
            outputs[i].copy_(flat.narrow(0, static_cast<int64_t>(i) * n, n).view(outputs[i].sizes()));
          }
        });
  }

  WorkPtr gather(const at::Tensor& input, std::vector<at::Tensor>* outputs, int root, bool async_op) override {
    auto in = stage(input);
    std::vector<Staged> staged{in};
    if (outputs) {
      for (auto& o : *outputs) staged.push_back(stage(o));
    }
    return launch("gather", staged, async_op, [&](cudaStream_t stream) {
      const ncclDataType_t type = ncclTypeOf(in.buf, "gather");
      if (in.buf.numel() == 0) return ncclSuccess;
      ncclGroupStart();
      if (group_.rank == root) {
        for (int q = 0; q < group_.size; ++q) {
          void* out = staged[1 + q].buf.data_ptr();
          if (q == root) {
            cudaMemcpyAsync(out, in.buf.data_ptr(), bytesOf(in.buf), cudaMemcpyDeviceToDevice, stream);
          } else {
            ncclRecv(out, in.buf.numel(), type, q, comm_, stream);
          }
        }
      } else {
        ncclSend(in.buf.data_ptr(), in.buf.numel(), type, root, comm_, stream);
      }
      return ncclGroupEnd();
    });
  }

  WorkPtr scatter(at::Tensor& output, const std::vector<at::Tensor>* inputs, int root, bool async_op) override {
    auto out = stage(output);
    std::vector<Staged> staged{out};
    if (inputs) {
      for (auto& i : *inputs) staged.push_back(stage(i));
    }
    return launch("scatter", staged, async_op, [&](cudaStream_t stream) {
      const ncclDataType_t type = ncclTypeOf(out.buf, "scatter");
      if (out.buf.numel() == 0) return ncclSuccess;
      ncclGroupStart();
      if (group_.rank == root) {
        for (int q = 0; q < group_.size; ++q) {
          const void* in = staged[1 + q].buf.data_ptr();
          if (q == root) {
            cudaMemcpyAsync(out.buf.data_ptr(), in, bytesOf(out.buf), cudaMemcpyDeviceToDevice, stream);
          } else {
            ncclSend(in, out.buf.numel(), type, q, comm_, stream);
          }
        }
      } else {
        ncclRecv(out.buf.data_ptr(), out.buf.numel(), type, root, comm_, stream);
      }
      return ncclGroupEnd();
    });
  }

  WorkPtr reduceScatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, ReduceOp op,
                        bool async_op) override {
    auto out = stage(output);
    std::vector<Staged> staged{out};
    for (auto& i : inputs) staged.push_back(Staged{i, i});
    // Held until the call has settled (the communicator may queue the op after returning).
    at::Tensor flat;
    return launch("reduce_scatter", staged, async_op, [&](cudaStream_t stream) {
      if (out.buf.numel() == 0) return ncclSuccess;
      // The inputs side by side, on the communication stream (it already waits for the caller's).
      flat = at::cat(flatViews(inputs));
      return ncclReduceScatter(flat.data_ptr(), out.buf.data_ptr(), out.buf.numel(),
                               ncclTypeOf(out.buf, "reduce_scatter"), opOf(op, out.buf, "reduce_scatter"), comm_,
                               stream);
    });
  }

  WorkPtr allToAll(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs, bool async_op) override {
    std::vector<Staged> staged;
    for (auto& o : outputs) staged.push_back(stage(o));
    for (auto& i : inputs) staged.push_back(stage(i));
    return launch("all_to_all", staged, async_op, [&](cudaStream_t stream) {
      const ncclDataType_t type = ncclTypeOf(inputs[0], "all_to_all");
      ncclGroupStart();
      for (int q = 0; q < group_.size; ++q) {
        const Staged& o = staged[q];
        const Staged& i = staged[group_.size + q];
        // An empty block on one side is empty on the other: neither posts it.
        if (i.buf.numel() > 0) ncclSend(i.buf.data_ptr(), i.buf.numel(), type, q, comm_, stream);
        if (o.buf.numel() > 0) ncclRecv(o.buf.data_ptr(), o.buf.numel(), type, q, comm_, stream);
      }
      return ncclGroupEnd();
    });
  }

  WorkPtr barrier(bool async_op) override {
    // An all_reduce of one number on the group's device (the current one before any op).
    const c10::Device device = comm_ ? device_ : c10::Device(c10::kCUDA, c10::cuda::current_device());
    at::Tensor token = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device));
    std::vector<Staged> staged{Staged{token, token}};
    return launch(
        "barrier", staged, async_op,
        [&](cudaStream_t stream) {
          return ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclInt32, ncclSum, comm_, stream);
        },
        /*blocks_host=*/true);
  }

  WorkPtr send(const at::Tensor& tensor, int peer, int /*tag: NCCL has none, as in torch*/) override {
    auto s = stage(tensor);
    return launch("send", {s}, true, [&](cudaStream_t stream) {
      if (s.buf.numel() == 0) return ncclSuccess;  // the peer's recv is empty too
      return ncclSend(s.buf.data_ptr(), s.buf.numel(), ncclTypeOf(s.buf, "send"), peer, comm_, stream);
    });
  }

  // One group of sends and receives and one Work for all (each item gets it).
  std::vector<WorkPtr> batchP2P(std::vector<P2PItem>& items) override {
    std::vector<Staged> staged;
    for (auto& item : items) staged.push_back(stage(item.tensor));
    auto work = launch("batch_isend_irecv", staged, true, [&](cudaStream_t stream) {
      ncclGroupStart();
      for (size_t i = 0; i < items.size(); ++i) {
        const at::Tensor& buf = staged[i].buf;
        if (buf.numel() == 0) continue;  // the peer's matching item is empty too
        const ncclDataType_t type = ncclTypeOf(buf, "batch_isend_irecv");
        if (items[i].send) {
          ncclSend(buf.data_ptr(), buf.numel(), type, items[i].peer, comm_, stream);
        } else {
          ncclRecv(buf.data_ptr(), buf.numel(), type, items[i].peer, comm_, stream);
        }
      }
      return ncclGroupEnd();
    });
    return std::vector<WorkPtr>(items.size(), work);
  }

  WorkPtr recv(at::Tensor& tensor, int peer, int /*tag*/) override {
    auto s = stage(tensor);
    return launch("recv", {s}, true, [&](cudaStream_t stream) {
      if (s.buf.numel() == 0) return ncclSuccess;
      return ncclRecv(s.buf.data_ptr(), s.buf.numel(), ncclTypeOf(s.buf, "recv"), peer, comm_, stream);
    });
  }

 private:
  static std::vector<at::Tensor> flatViews(const std::vector<at::Tensor>& list) {
    std::vector<at::Tensor> views;
    for (const auto& t : list) views.push_back(t.reshape({-1}));
    return views;
  }

  // AVG over one rank is the tensor itself: SUM there, which NCCL does as a plain copy rather
  // than its pre-multiplying kernel.
  ncclRedOp_t opOf(ReduceOp op, const at::Tensor& t, const char* what) const {
    return ncclOpOf(group_.size == 1 && op == ReduceOp::AVG && t.scalar_type() != at::kBool ? ReduceOp::SUM : op, t,
                    what);
  }
  // Issues `body` on the communication stream and settles it; then `after` (work queued behind
  // the op on that stream, such as copies out of its buffer).
  WorkPtr launch(const char* what, const std::vector<Staged>& staged, bool async_op,
                 const std::function<ncclResult_t(cudaStream_t)>& body, bool blocks_host = false,
                 const std::function<void()>& after = {});
  void makeComm(c10::Device device);
  void adopt(ncclComm_t comm, c10::Device device);
  // Settles an NCCL call on the non-blocking communicator: waits out ncclInProgress until
  // `deadline`; an error or the deadline breaks the group (and throws).
  void check(ncclResult_t result, const char* what, Clock::time_point deadline);
  void throwIfBroken();
  // Waits, outside any NCCL call, until fewer than kMaxInFlight ops are unfinished.
  void throttle();
  // Aborts the communicator, fails every pending op with `message`, and ends the process when
  // TORCH_NCCL_ASYNC_ERROR_HANDLING says so. Returns the error every later op throws.
  std::exception_ptr breakGroup(const std::string& message);
  void watchdog();
  // At teardown: waits (at most kPeerTeardownWait, or the group's timeout if shorter) until
  // every other rank has completed every op this one issued. Aborting first could cut a peer's
  // last op off: this rank's part of an op ends on its GPU while NCCL's proxy may still be
  // moving bytes the peer needs (a DDP rank that ended first failed its peer's last all_reduce
  // with "remote process exited" on an H200, ranks under load).
  void waitForPeers();
  static constexpr std::chrono::seconds kPeerTeardownWait{30};
  // Which ranks are behind op #seq, from what each published in the store.
  std::string blame(uint64_t seq);
  std::string where() const {
    return fmt::format("rank {} of {}, {}", group_.rank, group_.size, comm_ ? device_.str() : std::string("no device"));
  }
  std::string progressKey(int rank) const { return fmt::format("{}nccl/progress/{}", group_.prefix, rank); }

  NcclGroup group_;
  bool tear_down_ = true;
  // The caller's side of the communicator: one op issued at a time (NCCL needs the same order
  // on every rank), and the communicator aborted only while no call of the caller's thread is
  // inside NCCL (ncclCommAbort frees it). A group broken meanwhile is aborted as the call
  // leaves.
  class CallScope {
   public:
    explicit CallScope(NcclTensorBackend& backend) : backend_(backend), lock_(backend.launch_mutex_) {
      backend_.caller_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    }
    ~CallScope() {
      if (backend_.abort_deferred_.exchange(false)) backend_.abortOnce();
      backend_.caller_.store(std::thread::id(), std::memory_order_relaxed);
    }

   private:
    NcclTensorBackend& backend_;
    std::unique_lock<std::mutex> lock_;
  };
  std::mutex launch_mutex_;
  std::atomic<bool> breaking_{false};        // set once the group is broken: calls stop settling
  std::atomic<bool> abort_deferred_{false};  // broken while a call was in flight: it aborts
  std::atomic<std::thread::id> caller_;      // the thread inside a CallScope, if any
  std::atomic<bool> aborted_{false};
  void abortOnce() {
    if (!aborted_.exchange(true)) ncclCommAbort(comm_);
  }
  ncclComm_t comm_ = nullptr;
  c10::Device device_{c10::kCUDA, 0};
  std::optional<c10::cuda::CUDAStream> stream_;  // the communication stream
  uint64_t next_seq_ = 1;

  std::mutex mutex_;  // guards what follows
  std::condition_variable wake_;
  std::deque<std::shared_ptr<NcclWork>> pending_;
  std::exception_ptr broken_;
  bool stopping_ = false;
  std::thread watchdog_;
};

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

bool eventFired(const NcclWork& w, std::string& error);

void NcclTensorBackend::throttle() {
  std::unique_lock lock(mutex_);
  // The op kMaxInFlight from the newest done means the rest of the limit is free; the watchdog
  // pops finished ops only every so often, so the queue's length alone would overcount.
  while (!broken_ && pending_.size() >= kMaxInFlight) {
    std::string cuda_error;
    if (eventFired(*pending_[pending_.size() - kMaxInFlight], cuda_error) || !cuda_error.empty()) return;
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    lock.lock();
  }
}

WorkPtr NcclTensorBackend::launch(const char* what, const std::vector<Staged>& staged, bool async_op,
                                  const std::function<ncclResult_t(cudaStream_t)>& body, bool blocks_host,
                                  const std::function<void()>& after) {
  throttle();
  CallScope scope(*this);
  throwIfBroken();
  const c10::Device device = staged[0].user.device();
  for (const auto& s : staged) {
    if (!s.user.is_cuda()) throw DdprunError(fmt::format("{}: a CPU tensor cannot go through NCCL", what));
    if (comm_ && s.user.device() != device_) {
      throw DdprunError(
          fmt::format("{}: a tensor on {}, but this group's NCCL communicator is on {} (one device per "
                      "process, as in torch)",
                      what, s.user.device().str(), device_.str()));
    }
    if (s.user.device() != device) throw DdprunError(fmt::format("{}: tensors on more than one device", what));
  }
  if (!comm_) makeComm(device);
  c10::cuda::CUDAGuard guard(device_);
  ncclTypeOf(staged[0].buf, what);  // a dtype NCCL lacks fails before the op is counted
  std::vector<at::Tensor> keep;
  for (const auto& s : staged) {
    keep.push_back(s.user);
    keep.push_back(s.buf);
  }
  auto work = std::make_shared<NcclWork>(what, next_seq_++, device_, blocks_host, std::move(keep));
  // The communication stream waits for what the caller queued before the op.
  at::cuda::CUDAEvent ready;
  ready.record(at::cuda::getCurrentCUDAStream(device_.index()));
  ready.block(*stream_);
  for (const auto& s : staged) {
    c10::cuda::CUDACachingAllocator::recordStream(s.user.storage().data_ptr(), *stream_);
    c10::cuda::CUDACachingAllocator::recordStream(s.buf.storage().data_ptr(), *stream_);
  }
  {
    c10::cuda::CUDAStreamGuard on_comm_stream(*stream_);
    for (auto s : staged) s.load();
    check(body(stream_->stream()), what, Clock::now() + group_.timeout);
    if (after) after();
    for (auto s : staged) s.finish();
  }
  work->end.record(*stream_);
  {
    std::lock_guard pending_lock(mutex_);
    pending_.push_back(work);
  }
  wake_.notify_one();
  if (!async_op) work->wait();
  return work;
}

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

// Whether `w`'s end event fired. A CUDA error instead (a lost device, the CUDA runtime already
// unloading at exit) is returned in `error`, not thrown: this runs on the watchdog thread and in
// the destructor, where an exception would end the process.
bool eventFired(const NcclWork& w, std::string& error) {
  try {
    return w.end.query();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    error = what.substr(0, what.find('\n'));
    return false;
  }
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

}  // namespace

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
