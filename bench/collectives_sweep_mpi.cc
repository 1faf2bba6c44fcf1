// collectives_sweep_mpi: MPI's collectives (Open MPI here) in bench/collectives_sweep's
// table (rules in collectives_sweep_core.h), built where CMake finds MPI:
//   mpirun -np N build/bin/collectives_sweep_mpi [--impl NAME] [...]
// Exit status 1 when a result was wrong, 2 on bad arguments.
#include <mpi.h>

#include <cstdio>
#include <stdexcept>

#include "bench/collectives_sweep_core.h"

namespace {

class MpiOps final : public ddprun::bench::SweepOps {
 public:
  MpiOps() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allReduce(float* buf, size_t count) override {
    check(MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
  }
  void broadcast(float* buf, size_t count, int root) override {
    check(MPI_Bcast(buf, static_cast<int>(count), MPI_FLOAT, root, MPI_COMM_WORLD));
  }
  void allGather(const float* in, float* out, size_t count) override {
    check(
        MPI_Allgather(in, static_cast<int>(count), MPI_FLOAT, out, static_cast<int>(count), MPI_FLOAT, MPI_COMM_WORLD));
  }
  void reduceScatter(const float* in, float* out, size_t count) override {
    check(MPI_Reduce_scatter_block(in, out, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
  }
  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD)); }
  void maxOverRanks(std::vector<double>& values) override {
    check(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_MAX,
                        MPI_COMM_WORLD));
  }

 private:
  // MPI's default handler aborts the job on errors; this only catches a changed handler.
  static void check(int rc) {
    if (rc != MPI_SUCCESS) throw std::runtime_error("MPI call failed with code " + std::to_string(rc));
  }
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

int main(int argc, char** argv) {
  ddprun::bench::SweepOptions options;
  try {
    // Before MPI_Init, which starts Open MPI's threads; the arguments are the program's own.
    options = ddprun::bench::parseSweepArgs(argc, argv);
    ddprun::bench::pinRank(options, "OMPI_COMM_WORLD_LOCAL_RANK");
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "collectives_sweep_mpi: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collectives_sweep_mpi: %s\n", e.what());
    return 1;
  }
  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    MpiOps ops;
    status = ddprun::bench::runSweep(ops, options) == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collectives_sweep_mpi: %s\n", e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
