// The measuring loop of bench/collectives_sweep, shared by its C++ implementations
// (ddprun's runtime in collectives_sweep_ddprun.cc, Open MPI in collectives_sweep_mpi.cc);
// bench/collectives_sweep_torch.py is its line-for-line twin for gloo. Rules (the same in all):
//   - float32 sums; sizes 8 B, 32 B, ... (factors of 4) up to --max-bytes, plus 4 KiB (the
//     latency target, which the factor-4 series from 8 B skips). "bytes" is nccl-tests' size:
//     the buffer for all_reduce and broadcast, the whole gathered (all_gather) or scattered
//     (reduce_scatter) buffer, n blocks of count/n elements, for the other two.
//   - Per size: 2 warm-ups, then enough timed calls for about --seconds (from the slower
//     rank's second warm-up; at least 5, at most 20000). Each call is timed alone, after a
//     barrier; its time is the slowest rank's. p50 and p90 of those times; algbw = bytes /
//     p50, busbw = algbw * 2(n-1)/n (all_reduce), (n-1)/n (all_gather, reduce_scatter),
//     1 (broadcast), as nccl-tests defines them.
//   - Every call's result is checked against the exact expected values; inputs are refilled
//     before each call (outside the timed region).
// Rank 0 prints one line per (op, size):
//   sweep_row impl=NAME n=N op=OP bytes=B count=C type=float iters=I p50_us=.. p90_us=..
//     algbw_GBps=.. busbw_GBps=.. wrong=W
// and, for the wait probe, one line:
//   sweep_wait impl=NAME n=N wait_ms=MS wall_ms=.. cpu_ms=..
// With --pin, every rank first prints the CPUs it runs on once its implementation started:
//   sweep_pinned impl=NAME n=N rank=R cpus=C[,C...]
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ddprun::bench {

// One implementation's collectives on float32 buffers. Every rank calls each in the same
// order; each blocks until this rank's part is done. Failures throw.
class SweepOps {
 public:
  virtual ~SweepOps() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sums `count` floats across ranks in place.
  virtual void allReduce(float* buf, size_t count) = 0;
  // Copies root's `count` floats to every rank.
  virtual void broadcast(float* buf, size_t count, int root) = 0;
  // `out` gets size() blocks of `count` floats, block q from rank q.
  virtual void allGather(const float* in, float* out, size_t count) = 0;
  // `in` holds size() blocks of `count` floats; block rank(), summed over ranks, lands in `out`.
  virtual void reduceScatter(const float* in, float* out, size_t count) = 0;
  virtual void barrier() = 0;
  // Element-wise maximum over ranks, in place (the harness's own bookkeeping, not timed).
  virtual void maxOverRanks(std::vector<double>& values) = 0;
};

struct SweepOptions {
  std::string impl = "unnamed";  // the impl= field of every line
  std::vector<std::string> ops = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"};
  size_t min_bytes = 8;
  size_t max_bytes = 8 << 20;     // default 8 MiB on a small machine; --full: 256 MiB
  double seconds_per_size = 0.1;  // timed calls per size: about this long
  // After the sweep, rank 0 enters a 4 KiB all_reduce that the other ranks join only this
  // many milliseconds later, and reports the CPU time its process spent meanwhile (how
  // politely it waits). 0: skipped. Default 1000.
  int wait_probe_ms = 1000;
  // --pin 0,1: rank r runs on CPU pin[r % pin.size()], in every implementation alike. With
  // more ranks than CPUs, which ranks share a CPU decides a point's time as much as the
  // implementation does, and unpinned the scheduler places them anew in every run. Empty:
  // unpinned.
  std::vector<int> pin;
};

// Parses --impl NAME, --ops a,b,c, --min-bytes B, --max-bytes B, --full, --seconds S,
// --wait-probe-ms MS, --pin C,C,...
// Throws std::invalid_argument on anything else.
SweepOptions parseSweepArgs(int argc, char** argv);

// Puts the calling thread, and the threads it starts from then on, on the CPU options.pin
// names for the rank the launcher put in environment variable `local_rank_var`; nothing
// without --pin. Call before the implementation starts its threads. Throws
// std::runtime_error naming the variable or the CPU when it is unset or refused.
void pinRank(const SweepOptions& options, const char* local_rank_var);

// The sizes of one sweep, ascending (see the rules above).
std::vector<size_t> sweepSizes(const SweepOptions& options);

// Runs the sweep; prints on rank 0. Returns the number of wrong results on this rank.
// Throws what the implementation throws.
int runSweep(SweepOps& ops, const SweepOptions& options);

}  // namespace ddprun::bench
