// collectives_sweep_ddprun: ddprun's runtime (ddprun::dist, the torch.distributed API) in
// bench/collectives_sweep's table (rules in collectives_sweep_core.h). Launched by ddprun:
//   ddprun --standalone --nproc_per_node=N --no_python build/bin/collectives_sweep_ddprun [--impl NAME] [...]
// Shared memory or TCP follows DDPRUN_SHM, as in any worker. Exit status 1 when a result was wrong.
#include <cstdio>
#include <stdexcept>

#include "bench/collectives_sweep_core.h"
#include "worker_runtime/distributed.h"
#include "worker_runtime/error_record.h"

namespace {

namespace dist = ddprun::dist;

// The caller's buffers as tensors (no copies): what a torch user hands the runtime.
at::Tensor wrap(const float* p, size_t count) {
  return at::from_blob(const_cast<float*>(p), {static_cast<int64_t>(count)}, at::kFloat);
}

class DdprunOps final : public ddprun::bench::SweepOps {
 public:
  int rank() const override { return dist::get_rank(); }
  int size() const override { return dist::get_world_size(); }
  void allReduce(float* buf, size_t count) override {
    auto t = wrap(buf, count);
    dist::all_reduce(t);
  }
  void broadcast(float* buf, size_t count, int root) override {
    auto t = wrap(buf, count);
    dist::broadcast(t, root);
  }
  void allGather(const float* in, float* out, size_t count) override {
    std::vector<at::Tensor> outs;
    for (int q = 0; q < size(); ++q) outs.push_back(wrap(out + q * count, count));
    dist::all_gather(outs, wrap(in, count));
  }
  void reduceScatter(const float* in, float* out, size_t count) override {
    std::vector<at::Tensor> ins;
    for (int q = 0; q < size(); ++q) ins.push_back(wrap(in + q * count, count));
    auto t = wrap(out, count);
    dist::reduce_scatter(t, ins);
  }
  void barrier() override { dist::barrier(); }
  void maxOverRanks(std::vector<double>& values) override {
    auto t = at::from_blob(values.data(), {static_cast<int64_t>(values.size())}, at::kDouble);
    dist::all_reduce(t, dist::ReduceOp::MAX);
  }
};

}  // namespace

int main(int argc, char** argv) {
  ddprun::bench::SweepOptions options;
  try {
    options = ddprun::bench::parseSweepArgs(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collectives_sweep_ddprun: %s\n", e.what());
    return 2;
  }
  return ddprun::runtime::recordErrors([&] {
    dist::init_process_group();
    DdprunOps ops;
    const int wrong = ddprun::bench::runSweep(ops, options);
    dist::destroy_process_group();
    return wrong == 0 ? 0 : 1;
  });
}
