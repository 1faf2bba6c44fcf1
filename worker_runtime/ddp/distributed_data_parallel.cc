#include "worker_runtime/ddp/distributed_data_parallel.h"

#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdlib>

#include "common/error.h"
#include "common/logging.h"
#include "worker_runtime/ddp/reducer.h"
#include "worker_runtime/env_contract.h"
#include "worker_runtime/recovery/in_job.h"

namespace ddprun::ddp {
namespace {

// A parameter's identity for the cross-rank check: dtype, rank, sizes.
void appendSignature(const at::Tensor& t, std::vector<int64_t>& out) {
  out.push_back(static_cast<int64_t>(t.scalar_type()));
  out.push_back(t.dim());
  for (int64_t d : t.sizes()) out.push_back(d);
}

std::string describe(const std::vector<int64_t>& sig, size_t& pos) {
  const auto dtype = static_cast<at::ScalarType>(sig[pos]);
  const int64_t dims = sig[pos + 1];
  std::vector<int64_t> sizes(sig.begin() + static_cast<ptrdiff_t>(pos + 2),
                             sig.begin() + static_cast<ptrdiff_t>(pos + 2 + dims));
  pos += 2 + static_cast<size_t>(dims);
  return fmt::format("{} [{}]", c10::toString(dtype), fmt::join(sizes, ", "));
}

// Broadcasts tensors from `src` (global rank) with one message per device and dtype, as torch's
// _broadcast_coalesced buckets them (a model spread over a GPU and the CPU, as the tutorial's
// model-parallel demo on one GPU, cannot go as one tensor). The groups go in the order of their
// first tensor, the same on every rank even where the ranks' device indices differ.
void broadcastCoalesced(const std::vector<at::Tensor>& tensors, int src, const dist::Group& group) {
  torch::NoGradGuard no_grad;
  std::vector<std::vector<at::Tensor>> groups;
  for (const auto& t : tensors) {
    auto same = std::find_if(groups.begin(), groups.end(), [&](const std::vector<at::Tensor>& g) {
      return g.front().device() == t.device() && g.front().scalar_type() == t.scalar_type();
    });
    if (same == groups.end()) {
      groups.push_back({t});
    } else {
      same->push_back(t);
    }
  }
  for (auto& list : groups) {
    std::vector<at::Tensor> flat;
    for (const auto& t : list) flat.push_back(t.detach().reshape({-1}));
    at::Tensor joined = at::cat(flat);
    dist::broadcast(joined, src, group);
    int64_t offset = 0;
    for (auto& t : list) {
      t.detach().copy_(joined.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

}  // namespace

at::Device default_device() {
  const auto devices = static_cast<int>(at::getNumGPUs());
  if (devices == 0) return at::Device(at::kCPU);
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(runtime::localDeviceIndex(devices)));
}

at::Device device_from_choice(const std::string& choice) {
  if (choice == "cpu") return at::kCPU;
  const at::Device best = default_device();
  if (choice == "cuda" && !best.is_cuda()) {
    throw UsageError("--device cuda: no CUDA device is visible (or this LibTorch has no CUDA)");
  }
  return best;
}

DistributedDataParallelBase::DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module, DDPOptions options)
    : module_(std::move(module)), options_(std::move(options)) {
  if (!module_) throw DdprunError("DistributedDataParallel: the module is null");
  if (!dist::is_initialized()) {
    throw DdprunError("DistributedDataParallel: call ddprun::dist::init_process_group() first");
  }
  if (options_.bucket_cap_mb <= 0 || options_.first_bucket_cap_mb <= 0) {
    throw DdprunError("DistributedDataParallel: bucket_cap_mb and first_bucket_cap_mb must be positive");
  }
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    params.push_back(item.value());
    names.push_back(item.key());
  }
  if (params.empty()) {
    throw DdprunError("DistributedDataParallel: the module has no parameter that requires a gradient");
  }
  control_device_ = params.front().device();
  if (options_.device_ids.size() > 1) {
    throw DdprunError(
        fmt::format("DistributedDataParallel: device_ids names {} devices; one device per process, as "
                    "in torch",
                    options_.device_ids.size()));
  }
  if (!options_.device_ids.empty()) {
    input_device_ = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(options_.device_ids[0]));
    for (size_t k = 0; k < params.size(); ++k) {
      if (params[k].device() != *input_device_) {
        throw DdprunError(
            fmt::format("DistributedDataParallel: device_ids is [{}] but parameter {} ({}) is on {}; "
                        "move the module there first (module->to(device))",
                        options_.device_ids[0], k, names[k], params[k].device().str()));
      }
    }
  }
  verifyShapes(params, names);
  syncModuleState(dist::get_global_rank(options_.process_group, 0));
  reducer_ = std::make_unique<Reducer>(std::move(params), std::move(names), options_.process_group, options_);
  logger("ddp")->debug("DistributedDataParallel: {} buckets", reducer_->bucketIndices().size());
}

DistributedDataParallelBase::~DistributedDataParallelBase() = default;

void DistributedDataParallelBase::verifyShapes(const std::vector<at::Tensor>& params,
                                               const std::vector<std::string>& names) {
  const auto& group = options_.process_group;
  std::vector<int64_t> mine{static_cast<int64_t>(params.size())};
  for (const auto& p : params) appendSignature(p, mine);

  const auto on_device = at::TensorOptions().dtype(at::kLong).device(control_device_);
  at::Tensor length = at::tensor({static_cast<int64_t>(mine.size())}, at::kLong).to(control_device_);
  const int world = dist::get_world_size(group);
  std::vector<at::Tensor> lengths(static_cast<size_t>(world));
  for (auto& l : lengths) l = at::empty_like(length);
  dist::all_gather(lengths, length, group);
  int64_t longest = 0;
  for (const auto& l : lengths) longest = std::max(longest, l.item<int64_t>());
  at::Tensor padded = at::full({longest}, -1, on_device);
  padded.narrow(0, 0, static_cast<int64_t>(mine.size())).copy_(at::tensor(mine, at::kLong));
  std::vector<at::Tensor> all(static_cast<size_t>(world));
  for (auto& a : all) a = at::empty_like(padded);
  dist::all_gather(all, padded, group);

  for (auto& a : all) a = a.cpu();
  auto signatureOf = [&](size_t r) {
    const auto* data = all[r].data_ptr<int64_t>();
    return std::vector<int64_t>(data, data + lengths[r].item<int64_t>());
  };
  const std::vector<int64_t> reference = signatureOf(0);
  for (size_t r = 1; r < all.size(); ++r) {
    const std::vector<int64_t> other = signatureOf(r);
    if (other == reference) continue;
    const int global_r = dist::get_global_rank(group, static_cast<int>(r));
    const int global_0 = dist::get_global_rank(group, 0);
    if (other[0] != reference[0]) {
      throw DdprunError(
          fmt::format("DistributedDataParallel: rank {} has {} parameters requiring gradients but rank {} has {}",
                      global_0, reference[0], global_r, other[0]));
    }
    size_t pos_ref = 1;
    size_t pos_other = 1;
    for (int64_t k = 0; k < reference[0]; ++k) {
      const std::string a = describe(reference, pos_ref);
      const std::string b = describe(other, pos_other);
      if (a != b) {
        throw DdprunError(fmt::format("DistributedDataParallel: parameter {} ({}) is {} on rank {} but {} on rank {}",
                                      k, names[static_cast<size_t>(k)], a, global_0, b, global_r));
      }
    }
  }
}

void DistributedDataParallelBase::syncModuleState(int src) {
  std::vector<at::Tensor> state;
  for (const auto& p : module_->parameters()) state.push_back(p);
  for (const auto& b : module_->buffers()) state.push_back(b);
  broadcastCoalesced(state, src, options_.process_group);
}

std::vector<at::Tensor> DistributedDataParallelBase::parameters() const { return module_->parameters(); }

DistributedDataParallelBase::NoSyncGuard::NoSyncGuard(DistributedDataParallelBase& ddp)
    : ddp_(ddp), previous_(ddp.require_sync_) {
  ddp_.require_sync_ = false;
}

DistributedDataParallelBase::NoSyncGuard::~NoSyncGuard() { ddp_.require_sync_ = previous_; }

void DistributedDataParallelBase::register_comm_hook(CommHook hook) {
  if (!hook) throw DdprunError("register_comm_hook: the hook is empty");
  reducer_->setCommHook(std::move(hook));
}

std::vector<std::vector<size_t>> DistributedDataParallelBase::bucket_indices() const {
  return reducer_->bucketIndices();
}

std::vector<ReducerEvent> DistributedDataParallelBase::last_backward_events() const { return reducer_->events(); }

void DistributedDataParallelBase::beforeForward() {
  if (!torch::GradMode::is_enabled()) return;  // evaluation: no collectives, ranks may differ
  int buffer_source = dist::get_global_rank(options_.process_group, 0);
  if (joining_) {
    // [still active, highest active rank, this forward will reduce gradients], maxed.
    at::Tensor state = at::tensor({int64_t{1}, int64_t{dist::get_rank()}, int64_t{require_sync_ ? 1 : 0}}, at::kLong)
                           .to(control_device_);
    dist::all_reduce(state, dist::ReduceOp::MAX, options_.process_group);
    join_authority_ = static_cast<int>(state[1].item<int64_t>());
    buffer_source = join_authority_;
  }
  // A replacement's first forward (recovery/in_job.h): the survivors made this step's
  // broadcast before the step failed, and the state it took holds their buffers.
  const bool joined = recovery::takeJoinedForward();
  if (require_sync_ && options_.broadcast_buffers && !joined) {
    const auto buffers = module_->buffers();
    if (!buffers.empty()) broadcastCoalesced(buffers, buffer_source, options_.process_group);
  }
}

void DistributedDataParallelBase::afterForward(const std::vector<at::Tensor>& outputs) {
  if (!torch::GradMode::is_enabled() || !require_sync_) return;
  reducer_->prepareForBackward(outputs);
}

void DistributedDataParallelBase::join(const std::function<void()>& loop) {
  if (joining_) throw DdprunError("DistributedDataParallel::join: already inside join()");
  joining_ = true;
  join_authority_ = -1;
  try {
    loop();
  } catch (...) {
    joining_ = false;
    throw;
  }
  // This rank is out of input: answer the others' collectives until none is active.
  while (true) {
    at::Tensor state = at::tensor({int64_t{0}, int64_t{-1}, int64_t{0}}, at::kLong).to(control_device_);
    dist::all_reduce(state, dist::ReduceOp::MAX, options_.process_group);
    if (state[0].item<int64_t>() == 0) break;
    join_authority_ = static_cast<int>(state[1].item<int64_t>());
    if (state[2].item<int64_t>() == 0) continue;
    if (options_.broadcast_buffers) {
      const auto buffers = module_->buffers();
      if (!buffers.empty()) broadcastCoalesced(buffers, join_authority_, options_.process_group);
    }
    reducer_->shadowBackward();
  }
  joining_ = false;
  // Joined ranks skipped optimizer steps: the last rank to finish has the model everyone
  // should end with.
  if (join_authority_ >= 0) syncModuleState(join_authority_);
}

}  // namespace ddprun::ddp
