// The NCCL backend's ops (nccl_tensor_backend_impl.h): each collective and point-to-point op
// as NCCL calls on the communication stream, and launch(), which orders them after the
// caller's stream, settles the call and hands the op to the watchdog.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include "common/error.h"
#include "worker_runtime/backend/nccl_tensor_backend_impl.h"

namespace ddprun::dist::nccl {

WorkPtr NcclTensorBackend::broadcast(at::Tensor& tensor, int root, bool async_op) {
  auto s = stage(tensor);
  return launch("broadcast", {s}, async_op, [&](cudaStream_t stream) {
    if (s.buf.numel() == 0) return ncclSuccess;  // the same on every rank: nothing to move
    return ncclBroadcast(s.buf.data_ptr(), s.buf.data_ptr(), s.buf.numel(), ncclTypeOf(s.buf, "broadcast"), root, comm_,
                         stream);
  });
}

WorkPtr NcclTensorBackend::allReduce(at::Tensor& tensor, ReduceOp op, bool async_op) {
  auto s = stage(tensor);
  return launch("all_reduce", {s}, async_op, [&](cudaStream_t stream) {
    if (s.buf.numel() == 0) return ncclSuccess;
    return ncclAllReduce(s.buf.data_ptr(), s.buf.data_ptr(), s.buf.numel(), ncclTypeOf(s.buf, "all_reduce"),
                         opOf(op, s.buf, "all_reduce"), comm_, stream);
  });
}

WorkPtr NcclTensorBackend::reduce(at::Tensor& tensor, int root, ReduceOp op, bool async_op) {
  auto s = stage(tensor);
  return launch("reduce", {s}, async_op, [&](cudaStream_t stream) {
    if (s.buf.numel() == 0) return ncclSuccess;
    return ncclReduce(s.buf.data_ptr(), s.buf.data_ptr(), s.buf.numel(), ncclTypeOf(s.buf, "reduce"),
                      opOf(op, s.buf, "reduce"), root, comm_, stream);
  });
}

WorkPtr NcclTensorBackend::allGather(std::vector<at::Tensor>& outputs, const at::Tensor& input, bool async_op) {
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

WorkPtr NcclTensorBackend::gather(const at::Tensor& input, std::vector<at::Tensor>* outputs, int root, bool async_op) {
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

WorkPtr NcclTensorBackend::scatter(at::Tensor& output, const std::vector<at::Tensor>* inputs, int root, bool async_op) {
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

WorkPtr NcclTensorBackend::reduceScatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, ReduceOp op,
                                         bool async_op) {
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
                             ncclTypeOf(out.buf, "reduce_scatter"), opOf(op, out.buf, "reduce_scatter"), comm_, stream);
  });
}

WorkPtr NcclTensorBackend::allToAll(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                                    bool async_op) {
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

WorkPtr NcclTensorBackend::barrier(bool async_op) {
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

WorkPtr NcclTensorBackend::send(const at::Tensor& tensor, int peer, int /*tag: NCCL has none, as in torch*/) {
  auto s = stage(tensor);
  return launch("send", {s}, true, [&](cudaStream_t stream) {
    if (s.buf.numel() == 0) return ncclSuccess;  // the peer's recv is empty too
    return ncclSend(s.buf.data_ptr(), s.buf.numel(), ncclTypeOf(s.buf, "send"), peer, comm_, stream);
  });
}

// One group of sends and receives and one Work for all (each item gets it).
std::vector<WorkPtr> NcclTensorBackend::batchP2P(std::vector<P2PItem>& items) {
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

WorkPtr NcclTensorBackend::recv(at::Tensor& tensor, int peer, int /*tag*/) {
  auto s = stage(tensor);
  return launch("recv", {s}, true, [&](cudaStream_t stream) {
    if (s.buf.numel() == 0) return ncclSuccess;
    return ncclRecv(s.buf.data_ptr(), s.buf.numel(), ncclTypeOf(s.buf, "recv"), peer, comm_, stream);
  });
}

std::vector<at::Tensor> NcclTensorBackend::flatViews(const std::vector<at::Tensor>& list) {
  std::vector<at::Tensor> views;
  for (const auto& t : list) views.push_back(t.reshape({-1}));
  return views;
}

// AVG over one rank is the tensor itself: SUM there, which NCCL does as a plain copy rather
// than its pre-multiplying kernel.
ncclRedOp_t NcclTensorBackend::opOf(ReduceOp op, const at::Tensor& t, const char* what) const {
  return ncclOpOf(group_.size == 1 && op == ReduceOp::AVG && t.scalar_type() != at::kBool ? ReduceOp::SUM : op, t,
                  what);
}

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

}  // namespace ddprun::dist::nccl
