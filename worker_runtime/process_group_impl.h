// The insides of ddprun::dist (distributed.h) that in-job recovery (recovery/) shares with
// distributed.cc: a process group with its backends, and the process-wide state holding the
// store and the default group. Not installed: the runtime's own files include it.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/store/tcp_store_client.h"
#include "worker_runtime/backend/backend_spec.h"
#include "worker_runtime/backend/host_tensor_backend.h"
#include "worker_runtime/distributed.h"

namespace ddprun::dist {

class ProcessGroup {
 public:
  // `host` when the spec names the host backend for some device, `nccl` when it names NCCL.
  ProcessGroup(std::vector<int> ranks, int group_rank, runtime::BackendSpec spec,
               std::unique_ptr<HostTensorBackend> host, std::unique_ptr<Backend> nccl)
      : ranks_(std::move(ranks)),
        group_rank_(group_rank),
        spec_(spec),
        host_(std::move(host)),
        nccl_(std::move(nccl)) {}

  int rank() const { return group_rank_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  const runtime::BackendSpec& spec() const { return spec_; }
  Backend* nccl() { return nccl_.get(); }
  // The backend that runs `t`'s device (through the start-up wrapper while one is set);
  // throws DdprunError naming the op when none does.
  Backend& forTensor(const at::Tensor& t, const char* what) {
    Backend& b = live(t, what);
    if (&b == host_.get() && host_startup_) return *host_startup_;
    if (&b == nccl_.get() && nccl_startup_) return *nccl_startup_;
    return b;
  }
  // forTensor() without the start-up wrapper: recovery's own messages.
  Backend& live(const at::Tensor& t, const char* what) {
    const at::Device device = t.device();
    runtime::DeviceBackend b = runtime::DeviceBackend::kNone;
    if (device.is_cpu()) {
      b = spec_.cpu;
    } else if (device.is_cuda()) {
      b = spec_.cuda;
    } else {
      throw DdprunError(fmt::format("{}: tensors on {} are not supported (cpu and cuda are)", what, device.str()));
    }
    if (b == runtime::DeviceBackend::kHost) return *host_;
    if (b == runtime::DeviceBackend::kNccl) return *nccl_;
    throw DdprunError(
        fmt::format("{}: a {} tensor, but this group's backend ({}) runs none; name one for it, e.g. "
                    "backend \"cpu:gloo,cuda:nccl\"",
                    what, device.is_cpu() ? "CPU" : "CUDA", runtime::describeBackendSpec(spec_)));
  }
  // barrier() has no tensor: the host backend where the group has one (it needs no device).
  Backend& forBarrier() {
    if (host_) return host_startup_ ? *host_startup_ : static_cast<Backend&>(*host_);
    return nccl_startup_ ? *nccl_startup_ : *nccl_;
  }
  // Group rank of a global rank; throws for ranks outside the group.
  int local(int global, const char* what) const {
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (ranks_[i] == global) return static_cast<int>(i);
    }
    throw DdprunError(fmt::format("{}: rank {} is not in this group", what, global));
  }
  int global(int local_rank) const { return ranks_.at(local_rank); }
  // In-job recovery's wrappers around the backends (recovery/startup_record.h), or none.
  // Called by the thread that drives the group, between ops.
  template <typename Wrap>
  void wrapBackends(Wrap wrap) {
    host_startup_ = host_ ? wrap(static_cast<Backend&>(*host_)) : nullptr;
    nccl_startup_ = nccl_ ? wrap(*nccl_) : nullptr;
  }

 private:
  std::vector<int> ranks_;
  int group_rank_;
  runtime::BackendSpec spec_;
  std::unique_ptr<HostTensorBackend> host_;
  std::unique_ptr<Backend> nccl_;
  std::unique_ptr<Backend> host_startup_;
  std::unique_ptr<Backend> nccl_startup_;
};

struct GlobalState {
  std::mutex mutex;
  std::unique_ptr<rendezvous::StoreServer> server;
  std::shared_ptr<rendezvous::TcpStoreClient> store;  // shared with the NCCL watchdogs
  std::string prefix;
  std::string address;
  std::chrono::milliseconds timeout{};
  Group world;
  int next_group = 0;
  int restart_count = 0;
};

GlobalState& state();

// The default group's backends for `spec` (settled), connected under `prefix`: collective
// over every rank of the world; blocks up to `timeout`. Throws PeerError / StoreError.
Group makeWorld(GlobalState& s, const runtime::BackendSpec& spec, const std::string& prefix, int rank, int size,
                std::chrono::milliseconds timeout);

}  // namespace ddprun::dist
