// RemoteModule: the module lives in an Object on its owner; forward and
// parameters are built-in functions there.
#include "worker_runtime/rpc/remote_module.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <unistd.h>

#include <cmath>

#include "common/error.h"
#include "worker_runtime/rpc/dist_autograd.h"
#include "worker_runtime/rpc/internal.h"

namespace ddprun::rpc {

namespace {

struct ModuleObject : Object {
  std::string kind;
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const Args&, size_t first)> forward;
  std::string typeName() const override { return kind; }
};

Future ready(Value v) {
  Future f;
  f.set_result(std::move(v));
  return f;
}

// A module's shape comes from a caller: refuse sizes that are not positive or whose
// parameters (float32, with optimizer state about 4x) could not fit in this host's memory,
// before LibTorch allocates anything.
void checkShape(const std::string& kind, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) {
    throw DdprunError(fmt::format("RemoteModule {}: sizes must be positive, got {} x {}", kind, rows, cols));
  }
  const double bytes = static_cast<double>(rows) * static_cast<double>(cols) * sizeof(float);
  const double memory = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  if (bytes * 4 > memory) {
    throw DdprunError(
        fmt::format("RemoteModule {}: {} x {} parameters need {:.1f} GiB with optimizer state, more "
                    "than this host's {:.1f} GiB of memory",
                    kind, rows, cols, bytes * 4 / (1u << 30), memory / (1u << 30)));
  }
}

Value createModule(const Args& a) {
  const std::string& kind = a.at(0).toString();
  auto obj = std::make_shared<ModuleObject>();
  obj->kind = kind;
  if (kind == "EmbeddingBag") {
    const std::string& mode = a.at(3).toString();
    checkShape(kind, a.at(1).toInt(), a.at(2).toInt());
    torch::nn::EmbeddingBagOptions o(a.at(1).toInt(), a.at(2).toInt());
    // The weight's gradient is computed sparse (only the rows looked up): the context turns it
    // dense for anyone who reads it, and the optimizer applies it exactly as the dense one, so
    // nothing observable changes, but no 100000 x 64 zero-filled gradient is made per step.
    if (mode == "sum") {
      o.mode(torch::kSum).sparse(true);
    } else if (mode == "mean") {
      o.mode(torch::kMean).sparse(true);
    } else if (mode == "max") {
      o.mode(torch::kMax);
    } else {
      throw DdprunError("EmbeddingBag: mode must be sum, mean or max, got '" + mode + "'");
    }
    auto m = torch::nn::EmbeddingBag(o);
    obj->module = m.ptr();
    obj->forward = [m](const Args& in, size_t first) mutable {
      const at::Tensor offsets = in.size() > first + 1 ? in[first + 1].toTensor() : at::Tensor();
      return m->forward(in.at(first).toTensor(), offsets);
    };
  } else if (kind == "Linear") {
    checkShape(kind, a.at(1).toInt(), a.at(2).toInt());
    auto m = torch::nn::Linear(torch::nn::LinearOptions(a.at(1).toInt(), a.at(2).toInt()).bias(a.at(3).toBool()));
    obj->module = m.ptr();
    obj->forward = [m](const Args& in, size_t first) mutable { return m->forward(in.at(first).toTensor()); };
  } else {
    throw DdprunError("RemoteModule: unknown module kind '" + kind + "' (EmbeddingBag, Linear)");
  }
  if (a.size() > 4 && a[4].isInt()) reference_init(*obj->module, static_cast<uint64_t>(a[4].toInt()));
  return Value(std::shared_ptr<Object>(obj));
}

std::shared_ptr<ModuleObject> moduleOf(const Value& v) { return v.toRRef().local_value().toObjectAs<ModuleObject>(); }

RemoteModule make(const std::string& on, Args args) {
  RRef r = remote(on, "ddprun.module.create", args);
  detail::waitCreated(r);  // surfaces a construction error here, not at the first forward
  return RemoteModule(std::move(r));
}

}  // namespace

void reference_init(torch::nn::Module& module, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::NoGradGuard no_grad;
  if (auto* e = dynamic_cast<torch::nn::EmbeddingBagImpl*>(&module)) {
    e->weight.normal_(0, 1, gen);
  } else if (auto* l = dynamic_cast<torch::nn::LinearImpl*>(&module)) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(l->options.in_features()));
    l->weight.uniform_(-bound, bound, gen);
    if (l->bias.defined()) l->bias.uniform_(-bound, bound, gen);
  } else {
    throw DdprunError("reference_init: only EmbeddingBag and Linear are supported");
  }
}

RemoteModule RemoteModule::embedding_bag(const std::string& on, int64_t num_embeddings, int64_t embedding_dim,
                                         const std::string& mode, std::optional<uint64_t> seed) {
  return make(
      on, {"EmbeddingBag", num_embeddings, embedding_dim, mode, seed ? Value(static_cast<int64_t>(*seed)) : Value()});
}

RemoteModule RemoteModule::linear(const std::string& on, int64_t in_features, int64_t out_features, bool bias,
                                  std::optional<uint64_t> seed) {
  return make(on, {"Linear", in_features, out_features, bias, seed ? Value(static_cast<int64_t>(*seed)) : Value()});
}

Future RemoteModule::forward_async(const Args& inputs) const {
  Args args{Value(rref_)};
  args.insert(args.end(), inputs.begin(), inputs.end());
  return rpc_async(rref_.owner().name, "ddprun.module.forward", args);
}

at::Tensor RemoteModule::forward(const Args& inputs) const { return forward_async(inputs).wait().toTensor(); }

std::vector<RRef> RemoteModule::remote_parameters() const {
  std::vector<RRef> out;
  const Value list = rpc_sync(rref_.owner().name, "ddprun.module.parameters", {Value(rref_)});
  for (const auto& v : list.toList()) {
    out.push_back(v.toRRef());
  }
  return out;
}

void detail::registerModuleBuiltins() {
  registerBuiltin(
      "ddprun.module.create", [](const Args& a) { return ready(createModule(a)); }, false);
  registerBuiltin(
      "ddprun.module.forward",
      [](const Args& a) {
        auto m = moduleOf(a.at(0));
        if (dist_autograd::current_context_id() < 0) {
          // Outside a distributed-autograd context nobody can ask for
          // gradients: no graph.
          torch::NoGradGuard no_grad;
          return ready(Value(m->forward(a, 1)));
        }
        return ready(Value(m->forward(a, 1)));
      },
      false);
  registerBuiltin(
      "ddprun.module.parameters",
      [](const Args& a) {
        auto m = moduleOf(a.at(0));
        Value::List out;
        for (auto& p : m->module->parameters()) out.emplace_back(RRef(Value(p)));
        return ready(Value(std::move(out)));
      },
      false);
}

}  // namespace ddprun::rpc
