// The parameter-server + DDP hybrid of PyTorch's "Combining Distributed
// DataParallel with Distributed RPC Framework" tutorial (seed 000), on
// ddprun::rpc and ddprun::ddp, with the asynchronous parameter-server mode
// (seed 004) as an option.
//
//   ddprun --standalone --nproc_per_node=4 --no_python build/bin/hybrid_ps
//   [--batches 30]
//
// sync (default): ranks 0 and 1 are trainers whose Linear is replicated with
// DDP over a
//   process group of the two; rank 2, the master, builds the EmbeddingBag as a
//   RemoteModule on rank 3, the parameter server, and starts both trainers'
//   loops over RPC. Each step looks the bags up on the server, runs the DDP
//   Linear, and runs distributed backward (DDP averages the Linear's gradients
//   across trainers; the embedding's gradients travel to the server) and a
//   DistributedOptimizer step over both; the trainers then meet at a barrier,
//   so every update of a step is applied before either trainer's next lookup
//   and the run is reproducible (equal to --reference).
// async: the Linear lives on the server too; each trainer pulls its parameters,
// computes
//   gradients and pushes them (distributed backward + DistributedOptimizer)
//   without ever waiting for the other trainer (--slow-trainer/--slow-ms make
//   one deliberately slow).
// --device cuda|auto: the trainers' Linear (and its DDP) on their GPU, as seed 000
// does; the embedding table stays on the server's CPU, and RPC carries CPU tensors.
// --reference: one process computes the sync model on the same batches (the
// embedding
//   takes each trainer's gradient, the Linear their average), for comparison
//   via --dump.
//
// The master prints one line: mode, batches, median seconds per batch (the
// slower trainer), samples/s over both trainers, as the peer script
// rpc_ps_hybrid.py does.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/env_names.h"
#include "common/env_reader.h"
#include "common/error.h"
#include "worker_runtime/ddp/distributed_data_parallel.h"
#include "worker_runtime/distributed.h"
#include "worker_runtime/error_record.h"
#include "worker_runtime/rpc/dist_autograd.h"
#include "worker_runtime/rpc/distributed_optimizer.h"
#include "worker_runtime/rpc/remote_module.h"
#include "worker_runtime/rpc/rpc.h"

namespace rpc = ddprun::rpc;
namespace dist = ddprun::dist;
using rpc::Args;
using rpc::Value;

namespace {

struct Config {
  int64_t batches = 30;
  std::string mode = "sync";
  int64_t num_embeddings = 100000;
  int64_t dim = 64;
  int64_t bag = 20;
  int64_t bags = 64;
  int64_t out = 16;
  double lr = 0.05;
  int64_t seed = 0;
  int slow_trainer = -1;
  int64_t slow_ms = 0;
  int threads = 4;
  std::string dump;
  bool reference = false;
  std::string device = "cpu";  // the trainers' dense part: cpu, cuda or auto
};

constexpr uint64_t kEmbSeed = 1000;
constexpr uint64_t kFcSeed = 2000;

Value::List encode(const Config& c) {
  return {c.batches, c.mode, c.num_embeddings, c.dim,          c.bag,     c.bags,
          c.out,     c.lr,   c.seed,           c.slow_trainer, c.slow_ms, c.device};
}
Config decode(const Value::List& v) {
  Config c;
  c.batches = v.at(0).toInt();
  c.mode = v.at(1).toString();
  c.num_embeddings = v.at(2).toInt();
  c.dim = v.at(3).toInt();
  c.bag = v.at(4).toInt();
  c.bags = v.at(5).toInt();
  c.out = v.at(6).toInt();
  c.lr = v.at(7).toDouble();
  c.seed = v.at(8).toInt();
  c.slow_trainer = static_cast<int>(v.at(9).toInt());
  c.slow_ms = v.at(10).toInt();
  c.device = v.at(11).toString();
  return c;
}

// One trainer's batches: the same sequence in every mode and in the reference.
struct BatchSource {
  BatchSource(const Config& c, int trainer)
      : c_(c), gen_(at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(c.seed * 100 + trainer))) {}
  void next(at::Tensor& idx, at::Tensor& offsets, at::Tensor& target) {
    idx = at::randint(0, c_.num_embeddings, {c_.bag * c_.bags}, gen_);
    offsets = at::arange(0, c_.bag * c_.bags, c_.bag);
    target = at::randint(0, c_.out, {c_.bags}, gen_);
  }
  const Config& c_;
  at::Generator gen_;
};

double median(std::vector<double> v) {
  if (v.size() > 6) v.erase(v.begin(), v.begin() + 3);  // warm-up, as the peer script does
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void writeDump(const std::string& path, const std::vector<at::Tensor>& tensors) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (const auto& t0 : tensors) {
    at::Tensor t = t0.detach().to(at::kFloat).contiguous();
    const uint64_t n = static_cast<uint64_t>(t.numel());
    out.write(reinterpret_cast<const char*>(&n), sizeof n);
    out.write(reinterpret_cast<const char*>(t.data_ptr<float>()), static_cast<std::streamsize>(n * sizeof(float)));
  }
  if (!out) throw ddprun::DdprunError("hybrid_ps: cannot write " + path);
}

// ---- trainer side ----

std::atomic<int64_t> g_progress{0};
std::mutex g_fc_mutex;
torch::nn::Linear g_fc{nullptr};

double runTrainer(const Args& a) {
  rpc::RemoteModule emb(a.at(0).toRRef());
  const int trainer = static_cast<int>(a.at(1).toInt());
  const Config c = decode(a.at(2).toList());
  const bool sync = c.mode == "sync";
  // The embedding table stays on the server's CPU: its lookups arrive here on the CPU and move
  // to the device inside autograd, so their gradients go back to the server on the CPU.
  // --device cuda or auto on a machine with CUDA: cuda:(LOCAL_RANK modulo the visible devices),
  // as seed 000 puts its DDP Linear on the GPU.
  const at::Device device = ddprun::ddp::device_from_choice(c.device);
  BatchSource source(c, trainer);
  std::vector<rpc::RRef> params = emb.remote_parameters();
  std::unique_ptr<ddprun::ddp::DistributedDataParallel<torch::nn::LinearImpl>> ddp;
  std::vector<rpc::RRef> fc_params;
  if (sync) {
    torch::nn::Linear fc(torch::nn::LinearOptions(c.dim, c.out));
    rpc::reference_init(*fc, kFcSeed);  // on the CPU: the same start on every device
    fc->to(device);
    {
      std::lock_guard lock(g_fc_mutex);
      g_fc = fc;
    }
    ddprun::ddp::DDPOptions ddp_options;
    if (device.is_cuda()) ddp_options.device_ids = {device.index()};
    ddp = std::make_unique<ddprun::ddp::DistributedDataParallel<torch::nn::LinearImpl>>(fc.ptr(), ddp_options);
    // DDP's parameters are local: RRefs owned here, as torch's tutorial does.
    for (auto& p : ddp->parameters()) params.emplace_back(Value(p));
  } else {
    rpc::RemoteModule fc(a.at(3).toRRef());
    fc_params = fc.remote_parameters();
    params.insert(params.end(), fc_params.begin(), fc_params.end());
  }
  rpc::OptimizerOptions o;
  o.lr = c.lr;
  rpc::DistributedOptimizer opt("sgd", params, o);
  std::vector<double> times;
  for (int64_t b = 0; b < c.batches; ++b) {
    at::Tensor idx, offsets, target;
    source.next(idx, offsets, target);
    const auto t0 = std::chrono::steady_clock::now();
    if (trainer == c.slow_trainer && c.slow_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(c.slow_ms));
    {
      rpc::dist_autograd::Context ctx;
      at::Tensor out;
      if (sync) {
        out = (*ddp)(emb.forward({idx, offsets}).to(device));
      } else {
        // Pull: the Linear's current parameters, recorded so their gradients
        // are pushed back.
        at::Tensor weight = fc_params[0].to_here().toTensor().to(device);
        at::Tensor bias = fc_params[1].to_here().toTensor().to(device);
        out = at::linear(emb.forward({idx, offsets}).to(device), weight, bias);
      }
      auto loss = torch::nn::functional::cross_entropy(out, target.to(device));
      rpc::dist_autograd::backward(ctx.id(), {loss});
      opt.step(ctx.id());
    }
    if (sync) dist::barrier();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    g_progress.fetch_add(1);
  }
  return median(times);
}

// ---- the single-process reference ----

void runReference(const Config& c) {
  torch::nn::EmbeddingBag emb(torch::nn::EmbeddingBagOptions(c.num_embeddings, c.dim).mode(torch::kSum));
  torch::nn::Linear fc(torch::nn::LinearOptions(c.dim, c.out));
  rpc::reference_init(*emb, kEmbSeed);
  rpc::reference_init(*fc, kFcSeed);
  BatchSource s0(c, 0), s1(c, 1);
  for (int64_t b = 0; b < c.batches; ++b) {
    std::vector<at::Tensor> emb_grads, w_grads, b_grads;
    for (auto* s : {&s0, &s1}) {
      at::Tensor idx, offsets, target;
      s->next(idx, offsets, target);
      emb->zero_grad();
      fc->zero_grad();
      torch::nn::functional::cross_entropy(fc->forward(emb->forward(idx, offsets)), target).backward();
      emb_grads.push_back(emb->weight.grad().clone());
      w_grads.push_back(fc->weight.grad().clone());
      b_grads.push_back(fc->bias.grad().clone());
    }
    torch::NoGradGuard no_grad;
    // The server applies each trainer's embedding gradient; DDP averages the
    // Linear's.
    for (auto& g : emb_grads) emb->weight.add_(g, -c.lr);
    fc->weight.add_((w_grads[0] + w_grads[1]) / 2, -c.lr);
    fc->bias.add_((b_grads[0] + b_grads[1]) / 2, -c.lr);
  }
  std::printf("reference batches=%lld done\n", static_cast<long long>(c.batches));
  if (!c.dump.empty()) writeDump(c.dump, {emb->weight, fc->weight, fc->bias});
}

// ---- master ----

void runMaster(const Config& c) {
  auto emb = rpc::RemoteModule::embedding_bag("ps", c.num_embeddings, c.dim, "sum", kEmbSeed);
  std::optional<rpc::RemoteModule> fc;
  if (c.mode == "async") fc = rpc::RemoteModule::linear("ps", c.dim, c.out, true, kFcSeed);
  std::vector<rpc::Future> futures;
  for (int t = 0; t < 2; ++t) {
    Args args{Value(emb.module_rref()), t, Value(encode(c))};
    if (fc) args.emplace_back(fc->module_rref());
    futures.push_back(
        rpc::rpc_async("trainer" + std::to_string(t), "hybrid.run_trainer", args, std::chrono::hours(24)));
  }
  // Whoever finishes first: how far had the other got?
  int first = -1;
  while (first < 0) {
    for (int t = 0; t < 2 && first < 0; ++t) {
      if (futures[t].wait_for(std::chrono::milliseconds(2))) first = t;
    }
  }
  const int other = 1 - first;
  const int64_t other_steps =
      futures[other].done() ? c.batches : rpc::rpc_sync("trainer" + std::to_string(other), "hybrid.progress").toInt();
  auto medians = rpc::wait_all(futures);
  std::printf("first finished: trainer%d (%lld steps); trainer%d had done %lld\n", first,
              static_cast<long long>(c.batches), other, static_cast<long long>(other_steps));
  const double med = std::max(medians[0].toDouble(), medians[1].toDouble());
  std::printf(
      "ddprun-rpc-ps mode=%s batches=%lld median_batch_s=%.5f "
      "samples_per_s=%.1f\n",
      c.mode.c_str(), static_cast<long long>(c.batches), med, 2.0 * static_cast<double>(c.bags) / med);
  std::fflush(stdout);
  if (!c.dump.empty()) {
    std::vector<at::Tensor> tensors{emb.remote_parameters().at(0).to_here().toTensor()};
    if (fc) {
      for (auto& p : fc->remote_parameters()) tensors.push_back(p.to_here().toTensor());
    } else {
      const Value fc_params = rpc::rpc_sync("trainer0", "hybrid.fc_params");
      for (const auto& v : fc_params.toList()) tensors.push_back(v.toTensor());
    }
    writeDump(c.dump, tensors);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::runtime::recordErrors([&] {
    Config c;
    CLI::App app{"parameter server + DDP hybrid trainer (4 workers under ddprun)"};
    app.add_option("--batches", c.batches, "batches per trainer")->check(CLI::PositiveNumber);
    app.add_option("--mode", c.mode, "sync (DDP + parameter server) or async (parameter server only)")
        ->check(CLI::IsMember({"sync", "async"}));
    app.add_option("--num-embeddings", c.num_embeddings)->check(CLI::PositiveNumber);
    app.add_option("--dim", c.dim)->check(CLI::PositiveNumber);
    app.add_option("--bag", c.bag, "indices per bag")->check(CLI::PositiveNumber);
    app.add_option("--bags", c.bags, "bags per batch per trainer")->check(CLI::PositiveNumber);
    app.add_option("--out", c.out, "classes")->check(CLI::PositiveNumber);
    app.add_option("--lr", c.lr);
    app.add_option("--seed", c.seed);
    app.add_option("--slow-trainer", c.slow_trainer, "trainer (0 or 1) that sleeps every step")
        ->check(CLI::Range(0, 1));
    app.add_option("--slow-ms", c.slow_ms, "how long the slow trainer sleeps per step")->check(CLI::NonNegativeNumber);
    app.add_option("--threads", c.threads, "RPC worker threads")->check(CLI::PositiveNumber);
    app.add_option("--dump", c.dump, "write the final parameters (embedding, Linear weight, bias) here");
    app.add_flag("--reference", c.reference, "single process: the sync model on the same batches");
    app.add_option("--device", c.device,
                   "the trainers' dense part: cpu (default), cuda, or auto (a GPU per trainer where CUDA is)")
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    if (c.reference) {
      runReference(c);
      return 0;
    }
    namespace env = ddprun::env;
    if (!env::optionalString(env::kRank) || !env::optionalString(env::kWorldSize)) {
      throw ddprun::UsageError("hybrid_ps: start under ddprun (RANK/WORLD_SIZE unset)");
    }
    const int world = env::requireInteger(env::kWorldSize, 1, INT_MAX);
    if (world != 4) throw ddprun::UsageError("hybrid_ps: needs exactly 4 workers (--nproc_per_node=4)");
    const int rank = env::requireInteger(env::kRank, 0, world - 1);

    rpc::RpcBackendOptions options;
    options.num_worker_threads = c.threads;
    if (rank <= 1) {
      rpc::register_function("hybrid.run_trainer", [](const Args& a) { return Value(runTrainer(a)); });
      rpc::register_function("hybrid.progress", [](const Args&) { return Value(g_progress.load()); });
      rpc::register_function("hybrid.fc_params", [](const Args&) {
        std::lock_guard lock(g_fc_mutex);
        return Value(std::vector<at::Tensor>{g_fc->weight.detach(), g_fc->bias.detach()});
      });
      // auto: NCCL for the Linear's gradients on a GPU, the host backend on the CPU.
      if (c.mode == "sync") dist::init_process_group(c.device == "cpu" ? "gloo" : "auto", "env://", 2, rank);
      rpc::init_rpc("trainer" + std::to_string(rank), rank, 4, options);
    } else if (rank == 2) {
      rpc::init_rpc("master", rank, 4, options);
      runMaster(c);
    } else {
      rpc::init_rpc("ps", rank, 4, options);
    }
    rpc::shutdown();
    if (dist::is_initialized()) dist::destroy_process_group();
    return 0;
  });
}
