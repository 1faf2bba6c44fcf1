// DistributedOptimizer: a LocalOptimizer Object per owner, created with
// remote(); step is a built-in that applies the context's gradients under one
// lock per worker.
#include "worker_runtime/rpc/distributed_optimizer.h"

#include <fmt/format.h>
#include <torch/utils.h>

#include <cmath>
#include <map>
#include <mutex>
#include <unordered_map>

#include "common/error.h"
#include "worker_runtime/rpc/dist_autograd.h"
#include "worker_runtime/rpc/internal.h"

namespace ddprun::rpc {

namespace {

enum class OptKind { kSgd, kAdagrad, kAdam };

OptKind parseKind(const std::string& kind) {
  if (kind == "sgd" || kind == "SGD") return OptKind::kSgd;
  if (kind == "adagrad" || kind == "Adagrad") return OptKind::kAdagrad;
  if (kind == "adam" || kind == "Adam") return OptKind::kAdam;
  throw DdprunError("DistributedOptimizer: unknown optimizer '" + kind + "' (sgd, adagrad, adam)");
}

struct ParamState {
  int64_t step = 0;
  at::Tensor a;  // momentum buffer / sum / exp_avg
  at::Tensor b;  // exp_avg_sq
  at::Tensor c;  // max_exp_avg_sq
};

// torch's _LocalOptimizer global lock: steps on one worker never overlap.
std::mutex& stepMutex() {
  static std::mutex m;
  return m;
}

struct LocalOptimizer : Object {
  OptKind kind;
  OptimizerOptions o;
  std::vector<at::Tensor> params;
  std::vector<ParamState> state;
  std::string typeName() const override { return "optimizer"; }

  void step(int64_t context_id) {
    std::unordered_map<at::TensorImpl*, at::Tensor> grads;
    try {
      for (auto& [p, g] : detail::contextGradients(context_id)) grads[p.unsafeGetTensorImpl()] = g;
    } catch (const DdprunError&) {
      return;  // this worker never took part in the context: no gradients
    }
    std::lock_guard lock(stepMutex());
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      auto it = grads.find(params[i].unsafeGetTensorImpl());
      if (it == grads.end()) continue;
      update(params[i], it->second, state[i]);
    }
  }

  void update(at::Tensor& p, at::Tensor grad, ParamState& s) {
    if (grad.is_sparse()) {
      // Plain SGD adds the gradient's rows in place: the same update as the dense gradient.
      if (kind == OptKind::kSgd && o.momentum == 0 && o.weight_decay == 0) {
        p.add_(grad, -o.lr);
        return;
      }
      grad = grad.to_dense();
    }
    if (o.weight_decay != 0) grad = grad.add(p, o.weight_decay);
    switch (kind) {
      case OptKind::kSgd: {
        at::Tensor d = grad;
        if (o.momentum != 0) {
          if (!s.a.defined()) {
            s.a = d.clone().detach();
          } else {
            s.a.mul_(o.momentum).add_(d, 1 - o.dampening);
          }
          d = o.nesterov ? d.add(s.a, o.momentum) : s.a;
        }
        p.add_(d, -o.lr);
        break;
      }
      case OptKind::kAdagrad: {
        if (!s.a.defined()) s.a = at::full_like(p, o.initial_accumulator_value);
        s.step += 1;
        const double eps = o.eps < 0 ? 1e-10 : o.eps;
        const double clr = o.lr / (1 + (s.step - 1) * o.lr_decay);
        s.a.addcmul_(grad, grad, 1.0);
        p.addcdiv_(grad, s.a.sqrt().add_(eps), -clr);
        break;
      }
      case OptKind::kAdam: {
        if (!s.a.defined()) {
          s.a = at::zeros_like(p);
          s.b = at::zeros_like(p);
          if (o.amsgrad) s.c = at::zeros_like(p);
        }
        s.step += 1;
        const double eps = o.eps < 0 ? 1e-8 : o.eps;
        const double bc1 = 1 - std::pow(o.beta1, s.step);
        const double bc2 = 1 - std::pow(o.beta2, s.step);
        s.a.mul_(o.beta1).add_(grad, 1 - o.beta1);
        s.b.mul_(o.beta2).addcmul_(grad, grad, 1 - o.beta2);
        at::Tensor denom;
        if (o.amsgrad) {
          at::maximum_out(s.c, s.c, s.b);
          denom = (s.c.sqrt() / std::sqrt(bc2)).add_(eps);
        } else {
          denom = (s.b.sqrt() / std::sqrt(bc2)).add_(eps);
        }
        p.addcdiv_(s.a, denom, -(o.lr / bc1));
        break;
      }
    }
  }
};

Value::List encodeOptions(const OptimizerOptions& o) {
  return {o.lr,  o.momentum, o.dampening, o.nesterov, o.weight_decay, o.lr_decay, o.initial_accumulator_value,
          o.eps, o.beta1,    o.beta2,     o.amsgrad};
}

OptimizerOptions decodeOptions(const Value::List& v) {
  OptimizerOptions o;
  o.lr = v.at(0).toDouble();
  o.momentum = v.at(1).toDouble();
  o.dampening = v.at(2).toDouble();
  o.nesterov = v.at(3).toBool();
  o.weight_decay = v.at(4).toDouble();
  o.lr_decay = v.at(5).toDouble();
  o.initial_accumulator_value = v.at(6).toDouble();
  o.eps = v.at(7).toDouble();
  o.beta1 = v.at(8).toDouble();
  o.beta2 = v.at(9).toDouble();
  o.amsgrad = v.at(10).toBool();
  return o;
}

Future ready(Value v) {
  Future f;
  f.set_result(std::move(v));
  return f;
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(const std::string& kind, const std::vector<RRef>& parameters,
                                           OptimizerOptions options) {
  parseKind(kind);
  std::map<int, Value::List> by_owner;
  for (const auto& p : parameters) {
    DDPRUN_CHECK(static_cast<bool>(p), "DistributedOptimizer: empty RRef");
    by_owner[p.owner().id].emplace_back(p);
  }
  for (auto& [owner, params] : by_owner) {
    RRef opt = remote(detail::workerInfo(owner).name, "ddprun.optim.create",
                      {kind, Value(encodeOptions(options)), Value(std::move(params))});
    detail::waitCreated(opt);  // surfaces a creation error (e.g. a non-tensor RRef) here
    remote_optimizers_.push_back(std::move(opt));
  }
}

void DistributedOptimizer::step(int64_t context_id) {
  std::vector<Future> futures;
  RRef local;
  for (const auto& opt : remote_optimizers_) {
    if (opt.is_owner()) {
      local = opt;
    } else {
      futures.push_back(
          detail::callRank(opt.owner().id, "ddprun.optim.step", {Value(opt), context_id}, kDefaultTimeout, -1));
    }
  }
  std::exception_ptr error;
  if (local) {
    try {
      local.local_value().toObjectAs<LocalOptimizer>()->step(context_id);
    } catch (...) {
      error = std::current_exception();
    }
  }
  wait_all(futures);
  if (error) std::rethrow_exception(error);
}

void detail::registerOptimizerBuiltins() {
  registerBuiltin(
      "ddprun.optim.create",
      [](const Args& a) {
        auto opt = std::make_shared<LocalOptimizer>();
        opt->kind = parseKind(a.at(0).toString());
        opt->o = decodeOptions(a.at(1).toList());
        for (const auto& p : a.at(2).toList()) {
          Value v = p.toRRef().local_value();
          if (!v.isTensor()) throw DdprunError("DistributedOptimizer: a parameter RRef holds " + v.typeName());
          opt->params.push_back(v.toTensor());
        }
        opt->state.resize(opt->params.size());
        return ready(Value(std::shared_ptr<Object>(opt)));
      },
      false);
  registerBuiltin(
      "ddprun.optim.step",
      [](const Args& a) {
        a.at(0).toRRef().local_value().toObjectAs<LocalOptimizer>()->step(a.at(1).toInt());
        return ready({});
      },
      false);
}

}  // namespace ddprun::rpc
