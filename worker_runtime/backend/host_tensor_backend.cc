#include "worker_runtime/backend/host_tensor_backend.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <optional>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>

#include "common/error.h"

namespace ddprun::dist {

using runtime::CollectiveContext;
using runtime::DType;

namespace {

DType dtypeOf(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kDouble: return DType::kFloat64;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kInt: return DType::kInt32;
    case at::kLong: return DType::kInt64;
    case at::kByte: return DType::kUInt8;
    default:
      throw DdprunError(
          fmt::format("dtype {} is not supported by the gloo backend (float32, float64, float16, bfloat16, int32, "
                      "int64, uint8 are)",
                      c10::toString(t.scalar_type())));
  }
}

// What the flight recorder keeps of an operation on `t` (its data type and element count).
FlightOpInfo flightInfo(FlightOp op, const at::Tensor& t, int root = -1) {
  // runtime::DType and FlightDType share their codes.
  static_assert(static_cast<int>(DType::kUInt8) == static_cast<int>(FlightDType::kUInt8));
  return FlightOpInfo{op, static_cast<FlightDType>(dtypeOf(t)), static_cast<uint64_t>(t.numel()), root};
}

runtime::ReduceOp opOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return runtime::ReduceOp::kSum;
    case ReduceOp::PRODUCT: return runtime::ReduceOp::kProduct;
    case ReduceOp::MIN: return runtime::ReduceOp::kMin;
    case ReduceOp::MAX: return runtime::ReduceOp::kMax;
    case ReduceOp::AVG: return runtime::ReduceOp::kAvg;
  }
  return runtime::ReduceOp::kSum;
}

// The caller's current stream on a device tensor's device (none for a CPU tensor): the host
// copies of a CUDA tensor are made on it. Device-generic, so this file needs no CUDA headers.
std::optional<c10::Stream> callerStream(const at::Tensor& t) {
  if (t.device().is_cpu()) return std::nullopt;
  return c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device());
}

// Pinned host memory shaped like `t` (a device tensor): its copies to and from the device.
at::Tensor pinnedLike(const at::Tensor& t, at::IntArrayRef sizes) {
  return at::empty(sizes, t.options().device(at::kCPU).pinned_memory(true));
}

// A tensor as the host algorithms see it: contiguous CPU memory. A non-contiguous CPU tensor
// is worked on through a contiguous copy, a CUDA tensor through a pinned host copy. The copy
// in is made by load() when the op runs, not when it is issued: an op queued behind others on
// the group must read what they wrote back (an async SUM, then a blocking MAX of the same
// tensor). Either is written back by finish() when the operation ends (on whichever thread
// ran it).
struct Staged {
  at::Tensor user;
  at::Tensor buf;
  std::optional<c10::Stream> stream;  // a CUDA tensor's: the caller's current stream at issue
  bool fill = true;                   // whether the op reads the tensor
  void load() {
    if (!fill || buf.is_same(user)) return;
    std::optional<c10::StreamGuard> on_callers_stream;
    if (stream) on_callers_stream.emplace(*stream);
    buf.copy_(user);  // blocking: waits for the caller's stream
  }
  void finish() {
    if (buf.is_same(user)) return;
    std::optional<c10::StreamGuard> on_callers_stream;
    if (stream) on_callers_stream.emplace(*stream);
    user.copy_(buf);  // blocking: the result is in place when the Work completes
  }
  void* data() { return buf.data_ptr(); }
  size_t bytes() const { return buf.numel() * buf.element_size(); }
};

// Allocates the host copy of `t` (none for a contiguous CPU tensor); load() fills it.
// `fill`: whether the op reads the tensor (an output-only one needs no copy in).
Staged stage(const at::Tensor& t, bool fill = true) {
  dtypeOf(t);
  if (t.device().is_cpu()) {
    return Staged{t, t.is_contiguous() ? t : at::empty(t.sizes(), t.options()), std::nullopt, fill};
  }
  return Staged{t, pinnedLike(t, t.sizes()), callerStream(t), fill};
}

// A list of equally sized tensors (same dtype and device, checked by the caller) as one
// contiguous host buffer, and back. Contiguous CPU tensors, the usual case, go by memcpy:
// ATen's cat and copy_ cost a few microseconds of dispatch each, as much as a whole small
// collective on shared memory. flatBuffer() allocates when the op is issued; flatten() fills
// it when the op runs, after the ops issued before it (see Staged).
// One contiguous host buffer for `count` tensors like `like` (pinned for a device tensor).
at::Tensor flatBuffer(const at::Tensor& like, size_t count) {
  const std::vector<int64_t> sizes{static_cast<int64_t>(count) * like.numel()};
  return like.device().is_cpu() ? at::empty(sizes, like.options()) : pinnedLike(like, sizes);
}

at::Tensor flatBuffer(const std::vector<at::Tensor>& list) { return flatBuffer(list[0], list.size()); }

void flatten(const std::vector<at::Tensor>& list, at::Tensor& flat) {
  const int64_t n = list[0].numel();
  const bool on_host = list[0].device().is_cpu();
  if (n == 0) return;
  std::optional<c10::StreamGuard> on_callers_stream;
  if (!on_host) on_callers_stream.emplace(*callerStream(list[0]));
  for (size_t i = 0; i < list.size(); ++i) {
    if (on_host && list[i].is_contiguous()) {
      std::memcpy(static_cast<uint8_t*>(flat.data_ptr()) + i * n * flat.element_size(), list[i].data_ptr(),
                  n * flat.element_size());
    } else {
      flat.narrow(0, static_cast<int64_t>(i) * n, n).view(list[i].sizes()).copy_(list[i]);
    }
  }
}

// `stream`: the caller's, when the list is on a device.
void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& list, const std::optional<c10::Stream>& stream) {
  std::optional<c10::StreamGuard> on_callers_stream;
  if (stream) on_callers_stream.emplace(*stream);
  for (size_t i = 0; i < list.size(); ++i) {
    const int64_t n = list[i].numel();
    if (n == 0) continue;
    const auto* from = static_cast<const uint8_t*>(flat.data_ptr()) + i * n * flat.element_size();
    if (!stream && list[i].is_contiguous()) {
      std::memcpy(list[i].data_ptr(), from, n * flat.element_size());
    } else {
      list[i].copy_(flat.narrow(0, static_cast<int64_t>(i) * n, n).view(list[i].sizes()));
    }
  }
}

// Whether the host algorithms can work in the tensor itself: contiguous CPU memory.
bool directlyUsable(const at::Tensor& t) { return t.device().is_cpu() && t.is_contiguous(); }

bool directlyUsable(const std::vector<at::Tensor>& list) {
  return std::all_of(list.begin(), list.end(), [](const at::Tensor& t) { return directlyUsable(t); });
}

// The data pointers of a list of contiguous tensors (void or const void): in place up to
// the ranks of a large host, so a small call allocates nothing; on the heap beyond.
template <typename T>
class PointersOf {
 public:
  explicit PointersOf(const std::vector<at::Tensor>& list) : size_(list.size()) {
    if (size_ > kInPlace) heap_.resize(size_);
    T** to = size_ > kInPlace ? heap_.data() : in_place_.data();
    for (size_t i = 0; i < size_; ++i) to[i] = list[i].data_ptr();
  }
  T* const* data() const { return size_ > kInPlace ? heap_.data() : in_place_.data(); }

 private:
  static constexpr size_t kInPlace = 16;
  size_t size_;
  // Not zeroed: only the first size_ are read, and zeroing all of them (a `rep stos`) was a
  // third of this file's own cost in a small all_gather.
  std::array<T*, kInPlace> in_place_;
  std::vector<T*> heap_;
};

// Queues an async op; runs a synchronous one (inline when the group is idle) and waits.
// The caller of a synchronous op waits until it has run, so the op goes by reference: its
// std::function then holds one pointer in place, where a copy of the op's captures was a
// heap allocation on every small collective.
template <typename Collective>
WorkPtr issue(runtime::HostBackend& host, Collective&& collective, const FlightOpInfo& info, bool async_op) {
  if (async_op) return host.enqueue(std::forward<Collective>(collective), info);
  auto work = host.run(collective, info);
  work->wait();
  return work;
}

}  // namespace

WorkPtr HostTensorBackend::send(const at::Tensor& tensor, int peer, int tag) {
  // Point-to-point messages keep their own order, apart from the group's queue of collectives,
  // as in torch's gloo (waiting for queued collectives here would deadlock programs that gloo
  // runs): the tensor is read now, when the send is issued.
  auto staged = std::make_shared<Staged>(stage(tensor));
  staged->load();
  // The callback owns the staged copy until the message is out.
  return host_->p2p().send(
      peer, tag, staged->data(), staged->bytes(), runtime::Clock::now() + host_->timeout(), [staged] {},
      static_cast<FlightDType>(dtypeOf(staged->buf)));
}

WorkPtr HostTensorBackend::recv(at::Tensor& tensor, int peer, int tag) {
  auto staged = std::make_shared<Staged>(stage(tensor, /*fill=*/false));
  return host_->p2p().recv(
      peer, tag, staged->data(), staged->bytes(), runtime::Clock::now() + host_->timeout(),
      [staged] { staged->finish(); }, static_cast<FlightDType>(dtypeOf(staged->buf)));
}

// The synchronous calls on contiguous CPU tensors (the common small collective: a loss, a
// metric, a flag) work in the caller's memory through raw pointers: the caller holds its
// tensors until the call returns, so nothing is staged or captured by value, and no tensor's
// reference count is touched (those atomic updates were a fifth of such a call's own cost).
WorkPtr HostTensorBackend::broadcast(at::Tensor& tensor, int root, bool async_op) {
  if (!async_op && directlyUsable(tensor)) {
    void* data = tensor.data_ptr();
    const size_t bytes = tensor.numel() * tensor.element_size();
    return issue(
        *host_, [&](CollectiveContext& ctx) { runtime::broadcast(ctx, data, bytes, root); },
        flightInfo(FlightOp::kBroadcast, tensor, root), false);
  }
  auto staged = stage(tensor, /*fill=*/host_->rank() == root);
  return issue(
      *host_,
      [staged, root](CollectiveContext& ctx) mutable {
        staged.load();
        runtime::broadcast(ctx, staged.data(), staged.bytes(), root);
        staged.finish();
      },
      flightInfo(FlightOp::kBroadcast, staged.buf, root), async_op);
}

WorkPtr HostTensorBackend::allReduce(at::Tensor& tensor, ReduceOp op, bool async_op) {
  if (!async_op && directlyUsable(tensor)) {
    const DType dtype = dtypeOf(tensor);
    void* data = tensor.data_ptr();
    const size_t count = tensor.numel();
    return issue(
        *host_, [&](CollectiveContext& ctx) { runtime::allReduce(ctx, data, count, dtype, opOf(op)); },
        flightInfo(FlightOp::kAllReduce, tensor), false);
  }
  auto staged = stage(tensor);
  const DType dtype = dtypeOf(tensor);
  return issue(
      *host_,
      [staged, dtype, op](CollectiveContext& ctx) mutable {
        staged.load();
        runtime::allReduce(ctx, staged.data(), staged.buf.numel(), dtype, opOf(op));
        staged.finish();
      },
      flightInfo(FlightOp::kAllReduce, staged.buf), async_op);
}

WorkPtr HostTensorBackend::reduce(at::Tensor& tensor, int root, ReduceOp op, bool async_op) {
  auto staged = stage(tensor);
  const DType dtype = dtypeOf(tensor);
  return issue(
      *host_,
      [staged, dtype, op, root](CollectiveContext& ctx) mutable {
        staged.load();
        runtime::reduce(ctx, staged.data(), staged.buf.numel(), dtype, opOf(op), root);
        staged.finish();
      },
      flightInfo(FlightOp::kReduce, staged.buf, root), async_op);
}

WorkPtr HostTensorBackend::allGather(std::vector<at::Tensor>& outputs, const at::Tensor& input, bool async_op) {
  if (!async_op && directlyUsable(input) && directlyUsable(outputs)) {
    const void* in = input.data_ptr();
    const size_t bytes = input.numel() * input.element_size();
    const auto outs = PointersOf<void>(outputs);
    return issue(
        *host_, [&](CollectiveContext& ctx) { runtime::allGatherInto(ctx, in, outs.data(), bytes); },
        flightInfo(FlightOp::kAllGather, input), false);
  }
  auto in = stage(input);
  const FlightOpInfo info = flightInfo(FlightOp::kAllGather, in.buf);
  if (directlyUsable(outputs)) {
    // Straight into the caller's tensors: no flat buffer to allocate and copy out of. A
    // synchronous caller keeps them alive; a queued op holds them itself.
    return issue(
        *host_,
        [in, outs = PointersOf<void>(outputs),
         keep = async_op ? outputs : std::vector<at::Tensor>{}](CollectiveContext& ctx) mutable {
          in.load();
          runtime::allGatherInto(ctx, in.buf.data_ptr(), outs.data(), in.bytes());
        },
        info, async_op);
  }
  auto outs = outputs;
  auto flat = flatBuffer(input, outs.size());
  return issue(
      *host_,
      [in, flat, outs, stream = callerStream(outs[0])](CollectiveContext& ctx) mutable {
        in.load();
        runtime::allGather(ctx, in.data(), flat.data_ptr(), in.bytes());
        unflatten(flat, outs, stream);
      },
      info, async_op);
}

WorkPtr HostTensorBackend::gather(const at::Tensor& input, std::vector<at::Tensor>* outputs, int root, bool async_op) {
  auto in = stage(input);
  at::Tensor flat;
  std::vector<at::Tensor> outs;
  std::optional<c10::Stream> stream;
  if (outputs) {
    outs = *outputs;
    flat = flatBuffer(input, outs.size());
    stream = callerStream(outs[0]);
  }
  return issue(
      *host_,
      [in, flat, outs, stream, root](CollectiveContext& ctx) mutable {
        in.load();
        runtime::gather(ctx, in.data(), flat.defined() ? flat.data_ptr() : nullptr, in.bytes(), root);
        if (flat.defined()) unflatten(flat, outs, stream);
      },
      flightInfo(FlightOp::kGather, in.buf, root), async_op);
}

WorkPtr HostTensorBackend::scatter(at::Tensor& output, const std::vector<at::Tensor>* inputs, int root, bool async_op) {
  at::Tensor flat;
  std::vector<at::Tensor> ins;
  if (inputs) {
    ins = *inputs;
    flat = flatBuffer(ins);
  }
  auto out = stage(output, /*fill=*/false);
  return issue(
      *host_,
      [out, flat, ins, root](CollectiveContext& ctx) mutable {
        if (flat.defined()) flatten(ins, flat);
        runtime::scatter(ctx, flat.defined() ? flat.data_ptr() : nullptr, out.data(), out.bytes(), root);
        out.finish();
      },
      flightInfo(FlightOp::kScatter, out.buf, root), async_op);
}

WorkPtr HostTensorBackend::reduceScatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, ReduceOp op,
                                         bool async_op) {
  if (!async_op && directlyUsable(output) && directlyUsable(inputs)) {
    const DType dtype = dtypeOf(output);
    void* out = output.data_ptr();
    const size_t count = output.numel();
    const auto ins = PointersOf<const void>(inputs);
    return issue(
        *host_,
        [&](CollectiveContext& ctx) { runtime::reduceScatterFrom(ctx, ins.data(), out, count, dtype, opOf(op)); },
        flightInfo(FlightOp::kReduceScatter, output), false);
  }
  auto out = stage(output, /*fill=*/false);
  const DType dtype = dtypeOf(output);
  const FlightOpInfo info = flightInfo(FlightOp::kReduceScatter, out.buf);
  // The output may be one of the inputs: every path copies (or sends) a chunk of the other
  // ranks' blocks before it writes that chunk of the result.
  if (directlyUsable(inputs)) {
    // Straight from the caller's tensors: no flat copy of the input to allocate and fill.
    return issue(
        *host_,
        [out, ins = PointersOf<const void>(inputs), keep = async_op ? inputs : std::vector<at::Tensor>{}, dtype,
         op](CollectiveContext& ctx) mutable {
          runtime::reduceScatterFrom(ctx, ins.data(), out.data(), out.buf.numel(), dtype, opOf(op));
          out.finish();
        },
        info, async_op);
  }
  auto flat = flatBuffer(inputs);
  return issue(
      *host_,
      [out, flat, ins = inputs, dtype, op](CollectiveContext& ctx) mutable {
        flatten(ins, flat);
        runtime::reduceScatter(ctx, flat.data_ptr(), out.data(), out.buf.numel(), dtype, opOf(op));
        out.finish();
      },
      info, async_op);
}

WorkPtr HostTensorBackend::allToAll(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                                    bool async_op) {
  std::vector<Staged> ins, outs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    ins.push_back(stage(inputs[i]));
    outs.push_back(stage(outputs[i], /*fill=*/false));
  }
  uint64_t sent = 0;
  for (const auto& t : inputs) sent += static_cast<uint64_t>(t.numel());
  const FlightOpInfo info{FlightOp::kAllToAll, static_cast<FlightDType>(dtypeOf(inputs[0])), sent, -1};
  // Uneven sizes are allowed, as in torch: every pair exchanges its own block, all at once.
  return issue(
      *host_,
      [ins, outs](CollectiveContext& ctx) mutable {
        std::vector<std::span<const uint8_t>> in_blocks;
        std::vector<std::span<uint8_t>> out_blocks;
        for (auto& i : ins) i.load();
        for (auto& i : ins) in_blocks.emplace_back(static_cast<const uint8_t*>(i.data()), i.bytes());
        for (auto& o : outs) out_blocks.emplace_back(static_cast<uint8_t*>(o.data()), o.bytes());
        runtime::allToAllV(ctx, in_blocks, out_blocks);
        for (auto& o : outs) o.finish();
      },
      info, async_op);
}

WorkPtr HostTensorBackend::barrier(bool async_op) {
  return issue(
      *host_, [](CollectiveContext& ctx) { runtime::barrier(ctx); },
      FlightOpInfo{FlightOp::kBarrier, FlightDType::kNone, 0, -1}, async_op);
}

}  // namespace ddprun::dist
