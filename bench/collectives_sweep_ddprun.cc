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

// The caller's buffers as tensors (no copies): what a torch user hands the runtime. Made
// once per buffer, as a torch user holds tensors across steps (the gloo twin makes its
// tensors once per size too); building them costs more than a small collective itself.
class Tensors {
 public:
  // The tensors over `blocks` consecutive blocks of `count` floats from `p`.
  const std::vector<at::Tensor>& of(const float* p, size_t count, int blocks) {
    if (p != p_ || count != count_ || blocks != static_cast<int>(list_.size())) {
      p_ = p, count_ = count;
      list_.clear();
      for (int q = 0; q < blocks; ++q) {
        list_.push_back(at::from_blob(const_cast<float*>(p + q * count), {static_cast<int64_t>(count)}, at::kFloat));
      }
    }
    return list_;
  }
  at::Tensor& one(const float* p, size_t count) { return const_cast<at::Tensor&>(of(p, count, 1)[0]); }

 private:
  const float* p_ = nullptr;
  size_t count_ = 0;
  std::vector<at::Tensor> list_;
};

class DdprunOps final : public ddprun::bench::SweepOps {
 public:
  int rank() const override { return dist::get_rank(); }
  int size() const override { return dist::get_world_size(); }
  void allReduce(float* buf, size_t count) override { dist::all_reduce(in_.one(buf, count)); }
  void broadcast(float* buf, size_t count, int root) override { dist::broadcast(in_.one(buf, count), root); }
  void allGather(const float* in, float* out, size_t count) override {
    dist::all_gather(const_cast<std::vector<at::Tensor>&>(out_.of(out, count, size())), in_.one(in, count));
  }
  void reduceScatter(const float* in, float* out, size_t count) override {
    dist::reduce_scatter(out_.one(out, count), in_.of(in, count, size()));
  }
  void barrier() override { dist::barrier(); }
  void maxOverRanks(std::vector<double>& values) override {
    auto t = at::from_blob(values.data(), {static_cast<int64_t>(values.size())}, at::kDouble);
    dist::all_reduce(t, dist::ReduceOp::MAX);
  }

 private:
  Tensors in_, out_;
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
  try {
    ddprun::bench::pinRank(options, "LOCAL_RANK");  // before the runtime starts its threads
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collectives_sweep_ddprun: %s\n", e.what());
    return 1;
  }
  return ddprun::runtime::recordErrors([&] {
    dist::init_process_group();
    DdprunOps ops;
    const int wrong = ddprun::bench::runSweep(ops, options);
    dist::destroy_process_group();
    return wrong == 0 ? 0 : 1;
  });
}
