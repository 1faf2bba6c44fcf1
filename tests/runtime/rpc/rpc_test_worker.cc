// One RPC scenario per run, checked inside the workers: rpc_test.cc starts them
// (under ddprun or directly) and reads the exit status. Workers are named
// "w<rank>". Every check that fails prints "MISMATCH: ..." and makes the worker
// exit 1; a scenario that passes prints "scenario ok" once per worker.
//
//   rpc_test_worker <scenario>     with RANK, WORLD_SIZE, MASTER_ADDR,
//   MASTER_PORT set
#include <signal.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "common/env_reader.h"
#include "worker_runtime/error_record.h"
#include "worker_runtime/rpc/dist_autograd.h"
#include "worker_runtime/rpc/distributed_optimizer.h"
#include "worker_runtime/rpc/remote_module.h"
#include "worker_runtime/rpc/rpc.h"

namespace rpc = ddprun::rpc;
using namespace std::chrono_literals;
using rpc::Args;
using rpc::Value;

namespace {

int g_failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "MISMATCH: %s\n", what.c_str());
    ++g_failures;
  }
}

template <class E, class Fn>
std::string expectThrow(Fn&& fn, const std::string& what) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    expect(false, what + ": wrong exception type: " + e.what());
    return e.what();
  }
  expect(false, what + ": no exception");
  return {};
}

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && a.equal(b);
}

std::string name(int rank) { return "w" + std::to_string(rank); }

int envInt(const char* n) { return ddprun::env::requireInteger<int>(n); }

std::mutex g_hold_mutex;
rpc::RRef g_held;
std::atomic<bool> g_release{false};
at::Tensor g_param;  // a parameter on w1 for the autograd scenario

void registerCommon() {
  rpc::register_function("add", [](const Args& a) { return Value(a.at(0).toTensor() + a.at(1).toTensor()); });
  rpc::register_function("echo", [](const Args& a) { return Value(Value::List(a.begin(), a.end())); });
  rpc::register_function("concat", [](const Args& a) { return Value(a.at(0).toString() + a.at(1).toString()); });
  rpc::register_function("boom",
                         [](const Args& a) -> Value { throw std::runtime_error("boom: " + a.at(0).toString()); });
  rpc::register_function("sleep_ms", [](const Args& a) {
    std::this_thread::sleep_for(std::chrono::milliseconds(a.at(0).toInt()));
    return Value(a.at(0).toInt());
  });
  rpc::register_function("whoami", [](const Args&) { return Value(rpc::get_worker_info().name); });
  // A nested call: asks worker a[0] for add(a[1], a[2]) and doubles it.
  rpc::register_function("relay_add", [](const Args& a) {
    auto sum = rpc::rpc_sync(a.at(0).toString(), "add", {a.at(1), a.at(2)}).toTensor();
    return Value(sum * 2);
  });
  rpc::register_async_function("async_inc", [](const Args& a) {
    // Completes on another thread after the function returned.
    rpc::Future f;
    int64_t v = a.at(0).toInt();
    std::thread([f, v] {
      std::this_thread::sleep_for(20ms);
      f.set_result(Value(v + 1));
    }).detach();
    return f;
  });
  rpc::register_function("make_tensor", [](const Args& a) { return Value(at::full({a.at(0).toInt()}, 7.0)); });
  rpc::register_function("make_local_rref", [](const Args& a) { return Value(rpc::RRef(Value(a.at(0).toTensor()))); });
  rpc::register_function("hold", [](const Args& a) {
    std::lock_guard lock(g_hold_mutex);
    g_held = a.at(0).toRRef();
    return Value(g_held.to_here().toTensor().sum().item<double>());
  });
  rpc::register_function("drop", [](const Args&) {
    std::lock_guard lock(g_hold_mutex);
    g_held = rpc::RRef();
    return Value();
  });
  rpc::register_function("fetch_held", [](const Args&) {
    std::lock_guard lock(g_hold_mutex);
    return g_held.to_here();
  });
  rpc::register_function("owner_of_held", [](const Args&) {
    std::lock_guard lock(g_hold_mutex);
    return Value(g_held.owner().name);
  });
  // Autograd: returns x * p where p is this worker's parameter.
  rpc::register_function("mul_param", [](const Args& a) { return Value(a.at(0).toTensor() * g_param); });
  rpc::register_function("grad_of_param", [](const Args& a) {
    for (auto& [p, g] : rpc::dist_autograd::get_gradients(a.at(0).toInt())) {
      if (p.is_same(g_param)) return Value(g);
    }
    return Value();
  });
  rpc::register_function("param_grad_field_defined", [](const Args&) { return Value(g_param.grad().defined()); });
}

int64_t ownedOn(const std::string& worker) { return rpc::rpc_sync(worker, "ddprun.rref.owned_count").toInt(); }

// ---- scenarios ----

void scenarioCalls(int rank, int world) {
  const int peer = (rank + 1) % world;
  const std::string to = name(peer);
  // Tensors both ways (each rank calls its neighbour while being called).
  auto a = at::arange(10, at::kFloat) * (rank + 1);
  auto b = at::ones({10}, at::kFloat);
  expect(same(rpc::rpc_sync(to, "add", {a, b}).toTensor(), a + b), "rpc_sync add");
  // Scalars, strings, nested lists, every dtype.
  Value::List nested{int64_t{-5}, 2.5, true, "text", Value::List{at::arange(3, at::kLong), Value()}};
  auto echoed = rpc::rpc_sync(to, "echo", nested).toList();
  expect(echoed.size() == 5, "echo size");
  expect(echoed[0].toInt() == -5 && echoed[1].toDouble() == 2.5 && echoed[2].toBool() && echoed[3].toString() == "text",
         "echo scalars");
  expect(same(echoed[4].toList()[0].toTensor(), at::arange(3, at::kLong)) && echoed[4].toList()[1].isNone(),
         "echo nested list");
  for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong, at::kByte, at::kChar,
                     at::kShort, at::kBool}) {
    auto t = (at::arange(12) % 2).to(dtype).reshape({3, 4});
    expect(same(rpc::rpc_sync(to, "echo", {t}).toList()[0].toTensor(), t),
           std::string("dtype ") + c10::toString(dtype));
  }
  // Empty, zero-dim, non-contiguous and large tensors.
  expect(same(rpc::rpc_sync(to, "echo", {at::empty({0, 3})}).toList()[0].toTensor(), at::empty({0, 3})), "empty");
  expect(same(rpc::rpc_sync(to, "echo", {at::scalar_tensor(3.0)}).toList()[0].toTensor(), at::scalar_tensor(3.0)),
         "zero-dim");
  auto nc = at::arange(20, at::kFloat).reshape({4, 5}).t();
  expect(same(rpc::rpc_sync(to, "echo", {nc}).toList()[0].toTensor(), nc), "non-contiguous");
  auto big = at::rand({16 << 20});  // 64 MiB
  expect(same(rpc::rpc_sync(to, "echo", {big, big.narrow(0, 5, 100)}).toList()[0].toTensor(), big), "64 MiB tensor");
  expect(rpc::rpc_sync(to, "concat", {"ab", "cd"}).toString() == "abcd", "strings");
  // rpc_async, then(), wait_all, async functions, nested calls, calls to self.
  std::vector<rpc::Future> futures;
  for (int i = 0; i < 20; ++i) futures.push_back(rpc::rpc_async(to, "add", {at::full({2}, i), at::ones({2})}));
  auto values = rpc::wait_all(futures);
  for (int i = 0; i < 20; ++i)
    expect(values[i].toTensor()[0].item<double>() == i + 1, "rpc_async value " + std::to_string(i));
  auto chained =
      rpc::rpc_async(to, "async_inc", {int64_t{41}}).then([](rpc::Future f) { return Value(f.value().toInt() * 10); });
  expect(chained.wait().toInt() == 420, "async function + then");
  auto relayed = rpc::rpc_sync(to, "relay_add", {name(rank), at::ones({3}), at::ones({3})}).toTensor();
  expect(same(relayed, at::full({3}, 4.0)), "nested call back to the caller");
  expect(rpc::rpc_sync(name(rank), "whoami").toString() == name(rank), "rpc to self");
  // remote(): the value stays on the callee; to_here() fetches it; owner()
  // names it.
  rpc::RRef r = rpc::remote(to, "make_tensor", {int64_t{5}});
  expect(r.owner().name == to && !r.is_owner(), "remote owner");
  expect(same(r.to_here().toTensor(), at::full({5}, 7.0)), "remote to_here");
  rpc::RRef self_r = rpc::remote(name(rank), "make_tensor", {int64_t{2}});
  expect(self_r.is_owner() && same(self_r.local_value().toTensor(), at::full({2}, 7.0)), "remote to self");
  auto infos = rpc::get_all_worker_infos();
  expect(static_cast<int>(infos.size()) == world && rpc::get_worker_info(to).id == peer, "worker infos");
}

void scenarioErrors(int rank, int world) {
  if (rank != 0) return;
  const std::string to = name(1);
  auto msg = expectThrow<rpc::RemoteError>([&] { rpc::rpc_sync(to, "boom", {"details 42"}); }, "remote exception");
  expect(contains(msg, "boom: details 42") && contains(msg, "w1"), "remote exception message: " + msg);
  msg = expectThrow<rpc::RemoteError>([&] { rpc::rpc_async(to, "no_such_fn").wait(); }, "unknown function");
  expect(contains(msg, "no such function") && contains(msg, "no_such_fn"), "unknown function message: " + msg);
  msg = expectThrow<ddprun::DdprunError>([&] { rpc::rpc_sync("nobody", "add"); }, "unknown worker");
  expect(contains(msg, "nobody"), "unknown worker message: " + msg);
  msg = expectThrow<rpc::RemoteError>([&] { rpc::rpc_sync(to, "add", {"not a tensor", 1}); }, "bad argument");
  expect(contains(msg, "expected tensor"), "bad argument message: " + msg);
  // Timeouts: the call fails after its own timeout, the agent keeps working.
  const auto t0 = std::chrono::steady_clock::now();
  msg = expectThrow<rpc::RpcTimeout>([&] { rpc::rpc_sync(to, "sleep_ms", {int64_t{3000}}, 300ms); }, "timeout");
  const auto took = std::chrono::steady_clock::now() - t0;
  expect(took < 2500ms, "timeout fired before the function finished");
  expect(contains(msg, "sleep_ms") && contains(msg, "w1") && contains(msg, "timed out"), "timeout message: " + msg);
  auto f = rpc::rpc_async(to, "sleep_ms", {int64_t{3000}}, 200ms);
  expectThrow<rpc::RpcTimeout>([&] { f.wait(); }, "rpc_async timeout");
  expect(rpc::rpc_sync(to, "concat", {"still", " alive"}).toString() == "still alive", "agent usable after timeout");
  // A failing remote() surfaces from to_here().
  rpc::RRef bad = rpc::remote(to, "boom", {"in remote"});
  msg = expectThrow<rpc::RemoteError>([&] { bad.to_here(); }, "remote() failure");
  expect(contains(msg, "in remote"), "remote() failure message: " + msg);
  // A module cannot be sent by value.
  auto emb = rpc::RemoteModule::embedding_bag(to, 4, 2);
  msg = expectThrow<rpc::RemoteError>([&] { emb.module_rref().to_here(); }, "object to_here");
  expect(contains(msg, "cannot be sent"), "object message: " + msg);
  (void)world;
}

void scenarioRRef(int rank, int world) {
  // w0 creates a value on w2, hands it to w1, drops its own; the value lives
  // until w1 drops.
  if (rank == 0) {
    {
      rpc::RRef r = rpc::remote("w2", "make_tensor", {int64_t{4}});
      expect(same(r.to_here().toTensor(), at::full({4}, 7.0)), "to_here");
      expect(ownedOn("w2") == 1, "owner holds one value after remote()");
      expect(rpc::rpc_sync("w1", "hold", {r}).toDouble() == 28.0, "fork to a third worker");
      expect(rpc::rpc_sync("w1", "owner_of_held").toString() == "w2", "owner() on the forked RRef");
    }
    // Our reference is gone; w1 still holds one.
    std::this_thread::sleep_for(200ms);
    expect(ownedOn("w2") == 1, "value kept while a user holds it");
    expect(same(rpc::rpc_sync("w1", "fetch_held").toTensor(), at::full({4}, 7.0)), "fetch after creator dropped");
    rpc::rpc_sync("w1", "drop");
    bool freed = false;
    for (int i = 0; i < 200 && !freed; ++i) {
      freed = ownedOn("w2") == 0;
      if (!freed) std::this_thread::sleep_for(20ms);
    }
    expect(freed, "owner frees the value once no user holds it (count drops to zero)");
    // An RRef the owner made itself (RRef(value)) and returned: the owner keeps
    // it for us only.
    {
      rpc::RRef own = rpc::rpc_sync("w2", "make_local_rref", {at::ones({3})}).toRRef();
      expect(own.owner().name == "w2", "returned RRef owner");
      expect(ownedOn("w2") == 1, "returned RRef counted once");
      expect(same(own.to_here().toTensor(), at::ones({3})), "returned RRef value");
      // Passing it back to its owner and to ourselves keeps counts right.
      rpc::rpc_sync("w1", "hold", {own});
      rpc::rpc_sync("w1", "drop");
    }
    freed = false;
    for (int i = 0; i < 200 && !freed; ++i) {
      freed = ownedOn("w2") == 0;
      if (!freed) std::this_thread::sleep_for(20ms);
    }
    expect(freed, "owner-created RRef freed after all users dropped");
    // Many RRefs churned concurrently.
    {
      std::vector<rpc::RRef> many;
      for (int i = 0; i < 50; ++i) many.push_back(rpc::remote("w2", "make_tensor", {int64_t{1}}));
      for (auto& r : many) r.to_here();
      expect(ownedOn("w2") == 50, "fifty owned values");
    }
    freed = false;
    for (int i = 0; i < 200 && !freed; ++i) {
      freed = ownedOn("w2") == 0;
      if (!freed) std::this_thread::sleep_for(20ms);
    }
    expect(freed, "fifty values freed");
    // A local RRef: owner is self.
    rpc::RRef mine(Value(at::ones({2})));
    expect(mine.is_owner() && rpc::owned_rref_count() == 1, "local RRef");
  }
  (void)world;
}

void scenarioShutdown(int rank, int world) {
  // Every worker leaves calls in flight (slow ones, async ones) and calls
  // shutdown at once; shutdown must wait for all of them on every worker.
  const std::string to = name((rank + 1) % world);
  std::vector<rpc::Future> futures;
  for (int i = 0; i < 4; ++i) futures.push_back(rpc::rpc_async(to, "sleep_ms", {int64_t{300 + 100 * i}}));
  futures.push_back(rpc::rpc_async(to, "async_inc", {int64_t{1}}));
  rpc::shutdown();
  for (size_t i = 0; i < futures.size(); ++i) {
    expect(futures[i].done(), "future " + std::to_string(i) + " done when shutdown returned");
    if (futures[i].done()) {
      expect(!futures[i].exception(), "future " + std::to_string(i) + " succeeded");
    }
  }
  expect(futures[0].value().toInt() == 300 && futures[4].value().toInt() == 2, "values of drained calls");
  expectThrow<ddprun::DdprunError>([&] { rpc::rpc_sync(to, "whoami"); }, "call after shutdown");
}

void scenarioKilled(int rank, int world) {
  // w1 is killed by the test while w0 has a call pending on it with a long
  // timeout.
  if (rank == 0) {
    auto f = rpc::rpc_async("w1", "sleep_ms", {int64_t{120000}}, 60s);
    std::printf("call pending\n");
    std::fflush(stdout);
    const auto t0 = std::chrono::steady_clock::now();
    auto msg = expectThrow<rpc::PeerError>([&] { f.wait(); }, "pending call on a killed peer");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("failed after %.3f s: %s\n", s, msg.c_str());
    expect(contains(msg, "w1") && contains(msg, "rank 1"), "error names the peer: " + msg);
    msg = expectThrow<rpc::PeerError>([&] { rpc::rpc_sync("w1", "whoami", {}, 5s); }, "new call to a dead peer");
    expect(contains(msg, "w1"), "new call error names the peer: " + msg);
    std::printf("%s\n", g_failures == 0 ? "scenario ok" : "scenario FAILED");
    std::fflush(stdout);
    std::_Exit(g_failures == 0 ? 0 : 1);  // no graceful shutdown: a peer is gone
  }
  std::printf("waiting to be killed\n");
  std::fflush(stdout);
  std::this_thread::sleep_for(120s);
  (void)world;
}

void scenarioAutograd(int rank, int world) {
  // w0: x (a leaf of w0) -> w1: y = x * p (p a parameter of w1) -> w0: loss = 3
  // * sum(y)
  if (rank == 0) {
    auto x = at::arange(1, 5, at::kFloat).requires_grad_(true);
    at::Tensor p_on_w1 = at::full({4}, 0.5);
    rpc::dist_autograd::Context ctx;
    auto y = rpc::rpc_sync("w1", "mul_param", {x}).toTensor();
    expect(y.requires_grad(), "received tensor requires grad");
    auto loss = (y * 3).sum();
    rpc::dist_autograd::backward(ctx.id(), {loss});
    auto grads = rpc::dist_autograd::get_gradients(ctx.id());
    expect(grads.size() == 1 && grads[0].first.is_same(x), "one local gradient, for x");
    if (!grads.empty()) expect(grads[0].second.allclose(p_on_w1 * 3), "dL/dx = 3 p");
    expect(!x.grad().defined(), "x.grad untouched");
    auto gp = rpc::rpc_sync("w1", "grad_of_param", {ctx.id()}).toTensor();
    expect(gp.allclose(at::arange(1, 5, at::kFloat) * 3), "dL/dp = 3 x on the owner");
    expect(!rpc::rpc_sync("w1", "param_grad_field_defined").toBool(), "p.grad untouched on the owner");
    // Two hops: w0 -> w1 (mul_param) -> result passed through w1 again via
    // relay in a new context.
    {
      rpc::dist_autograd::Context ctx2;
      auto y1 = rpc::rpc_sync("w1", "mul_param", {x}).toTensor();
      auto y2 = rpc::rpc_sync("w1", "mul_param", {y1}).toTensor();  // x * p * p
      rpc::dist_autograd::backward(ctx2.id(), {y2.sum()});
      auto g = rpc::dist_autograd::get_gradients(ctx2.id());
      expect(g.size() == 1 && g[0].second.allclose(at::full({4}, 0.25)), "dL/dx = p^2 over two RPCs");
      auto gp2 = rpc::rpc_sync("w1", "grad_of_param", {ctx2.id()}).toTensor();
      // d(x p p)/dp = 2 x p
      expect(gp2.allclose(at::arange(1, 5, at::kFloat) * 2 * 0.5), "dL/dp = 2 x p over two RPCs");
    }
  }
  (void)world;
}

// RemoteModule + DistributedOptimizer against local torch::optim on the same
// data.
void scenarioOptim(int rank, int world) {
  if (rank != 0) return;
  for (const std::string kind : {"sgd", "adagrad", "adam"}) {
    auto emb = rpc::RemoteModule::embedding_bag("w1", 20, 4, "sum", 123);
    auto lin = rpc::RemoteModule::linear("w1", 4, 3, true, 7);
    torch::nn::EmbeddingBag ref_emb(torch::nn::EmbeddingBagOptions(20, 4).mode(torch::kSum));
    torch::nn::Linear ref_lin(torch::nn::LinearOptions(4, 3));
    rpc::reference_init(*ref_emb, 123);
    rpc::reference_init(*ref_lin, 7);
    std::vector<at::Tensor> ref_params = ref_emb->parameters();
    for (auto& p : ref_lin->parameters()) ref_params.push_back(p);
    std::unique_ptr<torch::optim::Optimizer> ref_opt;
    rpc::OptimizerOptions o;
    if (kind == "sgd") {
      o.lr = 0.1;
      o.momentum = 0.9;
      o.weight_decay = 0.01;
      ref_opt = std::make_unique<torch::optim::SGD>(ref_params,
                                                    torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01));
    } else if (kind == "adagrad") {
      o.lr = 0.1;
      ref_opt = std::make_unique<torch::optim::Adagrad>(ref_params, torch::optim::AdagradOptions(0.1));
    } else {
      o.lr = 0.01;
      ref_opt = std::make_unique<torch::optim::Adam>(ref_params, torch::optim::AdamOptions(0.01));
    }
    auto params = emb.remote_parameters();
    for (auto& p : lin.remote_parameters()) params.push_back(p);
    expect(params.size() == 3, "remote_parameters count");
    rpc::DistributedOptimizer opt(kind, params, o);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    for (int step = 0; step < 4; ++step) {
      auto idx = at::randint(0, 20, {12}, gen);
      auto off = at::arange(0, 12, 3);
      auto target = at::randint(0, 3, {4}, gen);
      {
        rpc::dist_autograd::Context ctx;
        auto h = emb.forward({idx, off});
        auto out = lin.forward({h});
        auto loss = at::cross_entropy_loss(out, target);
        rpc::dist_autograd::backward(ctx.id(), {loss});
        opt.step(ctx.id());
      }
      ref_opt->zero_grad();
      at::cross_entropy_loss(ref_lin->forward(ref_emb->forward(idx, off)), target).backward();
      ref_opt->step();
    }
    for (size_t i = 0; i < params.size(); ++i) {
      auto remote_value = params[i].to_here().toTensor();
      expect(remote_value.allclose(ref_params[i].detach(), 1e-5, 1e-6),
             kind + ": parameter " + std::to_string(i) + " equals the local optimizer's");
    }
  }
  (void)world;
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::runtime::recordErrors([&] {
    if (argc != 2) {
      std::fprintf(stderr,
                   "usage: rpc_test_worker "
                   "<calls|errors|rref|shutdown|killed|autograd|optim>\n");
      return 2;
    }
    const std::string scenario = argv[1];
    const int rank = envInt("RANK");
    const int world = envInt("WORLD_SIZE");
    registerCommon();
    g_param = at::full({4}, 0.5).requires_grad_(true);
    rpc::RpcBackendOptions options;
    options.num_worker_threads = 4;
    options.rpc_timeout = 60s;
    rpc::init_rpc(name(rank), rank, world, options);
    if (scenario == "calls") {
      scenarioCalls(rank, world);
    } else if (scenario == "errors") {
      scenarioErrors(rank, world);
    } else if (scenario == "rref") {
      scenarioRRef(rank, world);
    } else if (scenario == "shutdown") {
      scenarioShutdown(rank, world);
    } else if (scenario == "killed") {
      scenarioKilled(rank, world);
    } else if (scenario == "autograd") {
      scenarioAutograd(rank, world);
    } else if (scenario == "optim") {
      scenarioOptim(rank, world);
    } else {
      std::fprintf(stderr, "unknown scenario '%s'\n", scenario.c_str());
      return 2;
    }
    if (rpc::is_initialized()) rpc::shutdown();
    {
      std::lock_guard lock(g_hold_mutex);
      g_held = rpc::RRef();
    }
    std::printf("%s\n", g_failures == 0 ? "scenario ok" : "scenario FAILED");
    return g_failures == 0 ? 0 : 1;
  });
}
