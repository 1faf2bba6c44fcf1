// allreduce_bench: all_reduce bus bandwidth on CPU with ddprun's runtime, measured exactly
// as ../shared/anchors/gloo_allreduce.py measures gloo (same sizes, warm-up, iteration
// counts, barrier before each timed call, median; nccl-tests definitions:
// algbw = bytes / time, busbw = algbw * 2(n-1)/n). Launched by ddprun:
//   ddprun --standalone --nproc_per_node=2 --no_python build/bin/allreduce_bench [sizes_mb...]
// Rank 0 prints one line per size:
//   ddprun n=N bytes=B median_s=.. algbw_GBps=.. busbw_GBps=.. wrong=0
// The result of every call is checked (inputs of ones sum to n; sums stay exact).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker_runtime/distributed.h"
#include "worker_runtime/error_record.h"

int main(int argc, char** argv) {
  return ddprun::runtime::recordErrors([&] {
    namespace dist = ddprun::dist;
    dist::init_process_group();
    const int rank = dist::get_rank(), n = dist::get_world_size();
    std::vector<double> sizes_mb;
    for (int i = 1; i < argc; ++i) {
      size_t used = 0;
      const double mb = std::stod(argv[i], &used);
      if (argv[i][used] != '\0' || !(mb > 0)) throw std::invalid_argument(std::string("not a size in MB: ") + argv[i]);
      sizes_mb.push_back(mb);
    }
    if (sizes_mb.empty()) sizes_mb = {0.004, 1, 16, 64};
    int wrong_total = 0;
    for (double mb : sizes_mb) {
      const int64_t numel = std::max<int64_t>(1, static_cast<int64_t>(mb * 1024 * 1024 / 4));
      auto t = at::ones({numel}, at::kFloat);
      for (int i = 0; i < 2; ++i) {
        t.fill_(1);
        dist::all_reduce(t);
      }
      const int iters = mb < 4 ? 20 : 5;
      std::vector<double> times;
      int wrong = 0;
      for (int i = 0; i < iters; ++i) {
        t.fill_(1);
        dist::barrier();
        auto start = std::chrono::steady_clock::now();
        dist::all_reduce(t);
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        auto bad = (t != static_cast<float>(n)).nonzero();
        if (bad.numel() > 0) {
          const int64_t first = bad[0][0].item<int64_t>();
          std::fprintf(stderr, "rank %d: %lld of %lld elements wrong, first [%lld] = %g (expected %d)\n", rank,
                       static_cast<long long>(bad.size(0)), static_cast<long long>(numel),
                       static_cast<long long>(first), t[first].item<float>(), n);
          ++wrong;
        }
      }
      std::sort(times.begin(), times.end());
      const double median = times[times.size() / 2];
      const double bytes = static_cast<double>(numel) * 4;
      if (rank == 0) {
        std::printf("ddprun n=%d bytes=%lld median_s=%.6f algbw_GBps=%.3f busbw_GBps=%.3f wrong=%d\n", n,
                    static_cast<long long>(numel * 4), median, bytes / median / 1e9,
                    bytes / median / 1e9 * 2 * (n - 1) / n, wrong);
        std::fflush(stdout);
      }
      wrong_total += wrong;
    }
    dist::destroy_process_group();
    return wrong_total == 0 ? 0 : 1;
  });
}
