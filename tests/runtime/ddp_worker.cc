// A DDP worker for the tests, run under ddprun: every rank trains a DistributedDataParallel
// model on its slice of each global batch and also, on its own, a plain reference model on
// the whole batch; the two must end with the same parameters. Prints "OK <mode>" and exits 0
// when every check passes; prints what differs and exits 1 otherwise.
//
// usage: ddprun_ddp_worker MODE [bucket_cap_mb] [--device cpu|cuda]
//   MODE: equivalence | per_param_buckets | no_sync | unused | unused_error | buffers |
//         overlap | shapes | join | fp16 | bf16
//   --device cuda: both models and every batch on cuda:(LOCAL_RANK modulo the visible
//   devices), DDP with device_ids, backend auto (NCCL for the gradients); the GPU tests.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "worker_runtime/ddp/distributed_data_parallel.h"
#include "worker_runtime/distributed.h"

namespace dist = ddprun::dist;
namespace ddp = ddprun::ddp;

namespace {

constexpr int kSteps = 10;
constexpr int kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4 ranks
constexpr int kIn = 8;
constexpr int kOut = 4;

// Where the models and batches live (--device); the batches are drawn on the CPU and moved,
// so every device trains on the same numbers.
at::Device g_device(at::kCPU);

struct Net : torch::nn::Module {
  explicit Net(int hidden = 16, bool with_branch = false) {
    l1 = register_module("l1", torch::nn::Linear(kIn, hidden));
    l2 = register_module("l2", torch::nn::Linear(hidden, hidden));
    if (with_branch) branch = register_module("branch", torch::nn::Linear(hidden, hidden));
    never = register_module("never", torch::nn::Linear(hidden, hidden));
    never->weight.set_requires_grad(with_branch);  // part of the model only in the unused modes
    never->bias.set_requires_grad(with_branch);
    l3 = register_module("l3", torch::nn::Linear(hidden, kOut));
    offset = register_buffer("offset", torch::zeros({kOut}));
  }
  // `use_branch` decides per call whether the optional branch takes part.
  torch::Tensor forward(const torch::Tensor& x, bool use_branch = false) {
    auto h = torch::tanh(l2(torch::tanh(l1(x))));
    if (use_branch && branch) h = torch::tanh(branch(h));
    return l3(h) + offset;
  }
  torch::nn::Linear l1{nullptr}, l2{nullptr}, branch{nullptr}, never{nullptr}, l3{nullptr};
  torch::Tensor offset;
};

struct Batch {
  torch::Tensor x, y;
};

Batch globalBatch(int step) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(7 + step));
  auto x = torch::randn({kGlobalBatch, kIn}, gen);
  auto y = torch::randn({kGlobalBatch, kOut}, gen);
  return {x.to(g_device), y.to(g_device)};
}

Batch slice(const Batch& b, int rank, int world) {
  const int per = kGlobalBatch / world;
  return {b.x.narrow(0, rank * per, per), b.y.narrow(0, rank * per, per)};
}

double worstRelativeError(torch::nn::Module& got, torch::nn::Module& want) {
  auto a = got.named_parameters();
  double worst = 0;
  for (const auto& item : want.named_parameters()) {
    worst = std::max(worst, (a[item.key()] - item.value()).norm().item<double>() /
                                std::max(item.value().norm().item<double>(), 1e-12));
  }
  return worst;
}

// ||a - b|| / ||b|| for every parameter; reports each one over the tolerance.
bool sameParameters(torch::nn::Module& got, torch::nn::Module& want, double tolerance, const std::string& what) {
  auto a = got.named_parameters();
  auto b = want.named_parameters();
  bool ok = true;
  for (const auto& item : b) {
    const auto& mine = a[item.key()];
    const double err =
        (mine - item.value()).norm().item<double>() / std::max(item.value().norm().item<double>(), 1e-12);
    if (!(err <= tolerance)) {
      std::cout << fmt::format("MISMATCH {} rank {}: {} relative error {:.3g} > {:.1g}", what, dist::get_rank(),
                               item.key(), err, tolerance)
                << std::endl;
      ok = false;
    }
  }
  return ok;
}

size_t trainableCount(torch::nn::Module& m) {
  size_t n = 0;
  for (const auto& p : m.parameters()) n += p.requires_grad() ? 1 : 0;
  return n;
}

bool sameAcrossRanks(torch::nn::Module& m, const std::string& what) {
  bool ok = true;
  for (const auto& item : m.named_parameters()) {
    auto mine = item.value().detach().clone();
    auto root = mine.clone();
    dist::broadcast(root, 0);
    if (!torch::equal(mine, root)) {
      std::cout << fmt::format("MISMATCH {} rank {}: {} differs from rank 0", what, dist::get_rank(), item.key())
                << std::endl;
      ok = false;
    }
  }
  return ok;
}

std::shared_ptr<Net> makeNet(uint64_t seed, int hidden = 16, bool with_branch = false) {
  torch::manual_seed(seed);
  auto net = std::make_shared<Net>(hidden, with_branch);
  net->to(g_device);
  return net;
}

// DDP's options for this run: device_ids on a GPU, as torch's examples pass them.
ddp::DDPOptions deviceOptions() {
  ddp::DDPOptions options;
  if (g_device.is_cuda()) options.device_ids = {g_device.index()};
  return options;
}

// Plain data parallel training: DDP on slices vs the reference on whole batches.
int runEquivalence(const std::string& mode, double bucket_cap_mb) {
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();
  auto reference = makeNet(100);
  auto local = makeNet(100 + static_cast<uint64_t>(rank));  // different until DDP broadcasts
  ddp::DDPOptions options = deviceOptions();
  options.bucket_cap_mb = bucket_cap_mb;
  options.first_bucket_cap_mb = bucket_cap_mb;
  ddp::DistributedDataParallel<Net> model(local, options);
  if (mode == "fp16") model.register_comm_hook(ddp::fp16_compress_hook);
  if (mode == "bf16") model.register_comm_hook(ddp::bf16_compress_hook);
  if (mode == "per_param_buckets") {
    const auto buckets = model.bucket_indices();
    if (buckets.size() != trainableCount(*reference)) {
      std::cout << "MISMATCH expected one bucket per parameter, got " << buckets.size() << std::endl;
      return 1;
    }
  }
  if (!sameParameters(*local, *reference, 0.0, "after construction")) return 1;

  torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < kSteps; ++step) {
    const Batch global = globalBatch(step);
    const Batch mine = slice(global, rank, world);
    opt.zero_grad();
    torch::mse_loss(model(mine.x), mine.y).backward();
    opt.step();

    ref_opt.zero_grad();
    torch::mse_loss(reference->forward(global.x), global.y).backward();
    ref_opt.step();
  }
  // Half-precision wire formats round each gradient to ~3 (bf16: ~2) significant digits.
  const double tolerance = mode == "fp16" ? 5e-3 : mode == "bf16" ? 3e-2 : 1e-5;
  if (!sameParameters(*local, *reference, tolerance, mode)) return 1;
  if (mode == "fp16" || mode == "bf16") {
    // The hook must really have been used: exact float32 averaging would match to 1e-6.
    if (worstRelativeError(*local, *reference) < 1e-6) {
      std::cout << "MISMATCH " << mode << " gave exact float32 results: the hook did not run" << std::endl;
      return 1;
    }
  }
  return sameAcrossRanks(*local, mode) ? 0 : 1;
}

// Two micro-batches per step: the first under no_sync(), the second synchronized.
int runNoSync() {
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();
  auto reference = makeNet(100);
  auto local = makeNet(100 + static_cast<uint64_t>(rank));
  ddp::DistributedDataParallel<Net> model(local, deviceOptions());
  torch::optim::SGD opt(model.parameters(), 0.1);
  torch::optim::SGD ref_opt(reference->parameters(), 0.1);
  for (int step = 0; step < kSteps; ++step) {
    const Batch first = globalBatch(2 * step);
    const Batch second = globalBatch(2 * step + 1);
    opt.zero_grad();
    {
      auto guard = model.no_sync();
      const Batch mine = slice(first, rank, world);
      torch::mse_loss(model(mine.x), mine.y).backward();
    }
    if (world > 1 && step == 0) {
      // Inside no_sync the gradient is this rank's own: it must differ from rank 0's.
      auto g = local->l1->weight.grad().clone();
      auto root = g.clone();
      dist::broadcast(root, 0);
      if (rank != 0 && torch::equal(g, root)) {
        std::cout << "MISMATCH no_sync: gradients were synchronized inside no_sync()" << std::endl;
        return 1;
      }
    }
    const Batch mine = slice(second, rank, world);
    torch::mse_loss(model(mine.x), mine.y).backward();
    opt.step();

    ref_opt.zero_grad();
    torch::mse_loss(reference->forward(first.x), first.y).backward();
    torch::mse_loss(reference->forward(second.x), second.y).backward();
    ref_opt.step();
  }
  return sameParameters(*local, *reference, 1e-5, "no_sync") && sameAcrossRanks(*local, "no_sync") ? 0 : 1;
}

// The branch runs on even steps on rank 0 only; `never` runs nowhere.
int runUnused() {
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();
  auto reference = makeNet(100, 16, true);
  auto local = makeNet(100 + static_cast<uint64_t>(rank), 16, true);
  ddp::DDPOptions options = deviceOptions();
  options.find_unused_parameters = true;
  ddp::DistributedDataParallel<Net> model(local, options);
  torch::optim::SGD opt(model.parameters(), 0.1);
  torch::optim::SGD ref_opt(reference->parameters(), 0.1);
  for (int step = 0; step < kSteps; ++step) {
    const Batch global = globalBatch(step);
    const Batch mine = slice(global, rank, world);
    opt.zero_grad();
    torch::mse_loss(model(mine.x, rank == 0 && step % 2 == 0), mine.y).backward();
    opt.step();

    ref_opt.zero_grad();
    torch::Tensor loss = torch::zeros({}, g_device);
    for (int r = 0; r < world; ++r) {
      const Batch part = slice(global, r, world);
      loss = loss + torch::mse_loss(reference->forward(part.x, r == 0 && step % 2 == 0), part.y);
    }
    (loss / world).backward();
    ref_opt.step();
  }
  if (local->never->weight.grad().defined()) {
    std::cout << "MISMATCH unused: a parameter used on no rank got a gradient" << std::endl;
    return 1;
  }
  return sameParameters(*local, *reference, 1e-5, "unused") && sameAcrossRanks(*local, "unused") ? 0 : 1;
}

// Without find_unused_parameters a parameter without gradient is an error, not a hang.
int runUnusedError() {
  auto local = makeNet(100, 16, true);
  ddp::DistributedDataParallel<Net> model(local);
  const Batch mine = slice(globalBatch(0), dist::get_rank(), dist::get_world_size());
  torch::mse_loss(model(mine.x, false), mine.y).backward();  // throws: branch and never got nothing
  return 0;
}

int runBuffers() {
  const int rank = dist::get_rank();
  auto local = makeNet(100 + static_cast<uint64_t>(rank));
  local->offset.fill_(static_cast<float>(rank + 1));
  ddp::DistributedDataParallel<Net> model(local, deviceOptions());
  if (local->offset[0].item<float>() != 1.0F) {
    std::cout << "MISMATCH buffers: not broadcast at construction" << std::endl;
    return 1;
  }
  local->offset.fill_(static_cast<float>(10 * (rank + 1)));
  const Batch mine = slice(globalBatch(0), rank, dist::get_world_size());
  torch::mse_loss(model(mine.x), mine.y).backward();
  if (local->offset[0].item<float>() != 10.0F) {
    std::cout << "MISMATCH buffers: rank " << rank << " has " << local->offset[0].item<float>()
              << " after forward, rank 0 had 10" << std::endl;
    return 1;
  }
  return 0;
}

// With several buckets, the first reduction starts while backward still has gradients to go.
int runOverlap() {
  const int rank = dist::get_rank();
  auto local = makeNet(100 + static_cast<uint64_t>(rank), 256);
  ddp::DDPOptions options = deviceOptions();
  options.bucket_cap_mb = 0.25;
  options.first_bucket_cap_mb = 0.25;
  ddp::DistributedDataParallel<Net> model(local, options);
  if (model.bucket_indices().size() < 2) {
    std::cout << "MISMATCH overlap: expected several buckets" << std::endl;
    return 1;
  }
  const Batch mine = slice(globalBatch(0), rank, dist::get_world_size());
  torch::mse_loss(model(mine.x), mine.y).backward();
  const auto events = model.last_backward_events();
  size_t first_launch = events.size();
  size_t last_ready = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].kind == ddp::ReducerEvent::Kind::kBucketLaunched && first_launch == events.size()) first_launch = i;
    if (events[i].kind == ddp::ReducerEvent::Kind::kGradReady) last_ready = i;
  }
  if (!(first_launch < last_ready)) {
    std::cout << "MISMATCH overlap: first bucket launched at event " << first_launch << ", last gradient ready at "
              << last_ready << std::endl;
    return 1;
  }
  // Bucket 0 holds the last registered parameters (l3), reduced first.
  const auto first_bucket = model.bucket_indices().front();
  const size_t l3_weight = trainableCount(*local) - 2;
  if (std::find(first_bucket.begin(), first_bucket.end(), l3_weight) == first_bucket.end()) {
    std::cout << "MISMATCH overlap: the first bucket does not hold the last layer" << std::endl;
    return 1;
  }
  return 0;
}

int runShapes() {
  auto local = makeNet(100, dist::get_rank() == 1 ? 12 : 16);
  ddp::DistributedDataParallel<Net> model(local);  // throws on every rank
  return 0;
}

// Uneven inputs: rank r has 3 + 2r batches. The reference replays what join() promises:
// each step averages the active ranks' gradients over the whole world.
int runJoin() {
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();
  auto reference = makeNet(100);
  auto local = makeNet(100 + static_cast<uint64_t>(rank));
  ddp::DistributedDataParallel<Net> model(local, deviceOptions());
  torch::optim::SGD opt(model.parameters(), 0.1);
  torch::optim::SGD ref_opt(reference->parameters(), 0.1);
  auto batchesOf = [](int r) { return 3 + 2 * r; };
  model.join([&] {
    for (int step = 0; step < batchesOf(rank); ++step) {
      const Batch mine = slice(globalBatch(step), rank, world);
      opt.zero_grad();
      torch::mse_loss(model(mine.x), mine.y).backward();
      opt.step();
    }
  });
  for (int step = 0; step < batchesOf(world - 1); ++step) {
    ref_opt.zero_grad();
    torch::Tensor loss = torch::zeros({}, g_device);
    for (int r = 0; r < world; ++r) {
      if (step >= batchesOf(r)) continue;
      const Batch part = slice(globalBatch(step), r, world);
      loss = loss + torch::mse_loss(reference->forward(part.x), part.y);
    }
    (loss / world).backward();
    ref_opt.step();
  }
  return sameParameters(*local, *reference, 1e-5, "join") && sameAcrossRanks(*local, "join") ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: ddprun_ddp_worker MODE [bucket_cap_mb]" << std::endl;
    return 2;
  }
  const std::string mode = argv[1];
  double bucket_cap_mb = 25.0;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--device" && i + 1 < argc) {
      const std::string device = argv[++i];
      if (device == "cuda") {
        g_device = ddp::default_device();
        if (!g_device.is_cuda()) {
          std::cerr << "ddprun_ddp_worker: --device cuda: no CUDA device is visible" << std::endl;
          return 2;
        }
        c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(g_device);
      } else if (device != "cpu") {
        std::cerr << "ddprun_ddp_worker: --device is cpu or cuda" << std::endl;
        return 2;
      }
    } else {
      size_t used = 0;
      bucket_cap_mb = std::stod(arg, &used);
      if (used != arg.size() || !(bucket_cap_mb > 0)) {
        std::cerr << "ddprun_ddp_worker: bucket_cap_mb '" << arg << "' is not a positive number" << std::endl;
        return 2;
      }
    }
  }
  torch::set_num_threads(1);
  try {
    dist::init_process_group();
    int rc = 2;
    if (mode == "equivalence" || mode == "per_param_buckets" || mode == "fp16" || mode == "bf16") {
      rc = runEquivalence(mode, bucket_cap_mb);
    } else if (mode == "no_sync") {
      rc = runNoSync();
    } else if (mode == "unused") {
      rc = runUnused();
    } else if (mode == "unused_error") {
      rc = runUnusedError();
    } else if (mode == "buffers") {
      rc = runBuffers();
    } else if (mode == "overlap") {
      rc = runOverlap();
    } else if (mode == "shapes") {
      rc = runShapes();
    } else if (mode == "join") {
      rc = runJoin();
    } else {
      std::cerr << "ddprun_ddp_worker: unknown mode " << mode << std::endl;
    }
    if (rc == 0) std::cout << "OK " << mode << " rank " << dist::get_rank() << std::endl;
    dist::destroy_process_group();
    return rc;
  } catch (const std::exception& e) {
    std::cout << "ERROR " << e.what() << std::endl;
    return 1;
  }
}
