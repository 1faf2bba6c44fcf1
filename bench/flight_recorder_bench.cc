// flight_recorder_bench: what the flight recorder (worker_runtime/flight_recorder.h) costs
// an all_reduce of 4 KiB, the size where a fixed cost per operation shows most. Each rank
// opens two host-backend groups in the same run, one recording (into DDPRUN_FLIGHT_DIR, as
// under ddprun) and one not, and times blocks of all_reduces on each in turn, alternating
// which goes first, so that load from elsewhere falls on both alike. It also times the
// recorder's own calls (enqueue, start, finish) in a loop, which bounds its cost directly.
//   ddprun --standalone --nproc_per_node=2 --no_python build/bin/flight_recorder_bench [rounds=101] [iters=300]
// Rank 0 prints the nccl-tests table (one row per variant, median over rounds), then the
// median over rounds of on/off (each round's two blocks are adjacent in time), the
// recorder's own cost per operation and that cost's share of the median all_reduce "off":
//   flight_recorder bytes=4096 on_us=.. off_us=.. ratio=.. recorder_ns_per_op=.. recorder_share=..
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "common/env_reader.h"
#include "rendezvous/store/tcp_store_client.h"
#include "worker_runtime/backend/host_backend.h"
#include "worker_runtime/env_contract.h"
#include "worker_runtime/error_record.h"

namespace {

using namespace ddprun::runtime;
using Seconds = std::chrono::duration<double>;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per all_reduce over `iters` calls; counts results that are not the world size.
double timeBlock(HostBackend& b, std::vector<float>& buf, int iters, int& wrong) {
  const ddprun::FlightOpInfo info{ddprun::FlightOp::kAllReduce, ddprun::FlightDType::kFloat32, buf.size(), -1};
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    std::fill(buf.begin(), buf.end(), 1.0f);
    b.enqueue([&](CollectiveContext& ctx) { allReduce(ctx, buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum); },
              info)
        ->wait();
    if (buf[0] != static_cast<float>(b.size()) || buf.back() != static_cast<float>(b.size())) ++wrong;
  }
  return Seconds(std::chrono::steady_clock::now() - start).count() / iters;
}

// Nanoseconds of one operation's recording (enqueue, start, finish), in a private ring.
double recorderNsPerOp() {
  FlightRecorder recorder("", 0, 999, 0, 1);
  const ddprun::FlightOpInfo info{ddprun::FlightOp::kAllReduce, ddprun::FlightDType::kFloat32, 1024, -1};
  constexpr int kOps = 1000000;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kOps; ++i) {
    const uint64_t seq = recorder.enqueue(info);
    recorder.start(seq);
    recorder.finish(seq, true);
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / kOps;
}

}  // namespace

int main(int argc, char** argv) {
  return recordErrors([&] {
    const auto rounds = static_cast<int>(argc > 1 ? ddprun::env::parseInteger("rounds", argv[1], 1, INT32_MAX) : 101);
    const auto iters = static_cast<int>(argc > 2 ? ddprun::env::parseInteger("iters", argv[2], 1, INT32_MAX) : 300);
    if (rounds < 1 || iters < 1) throw std::invalid_argument("usage: flight_recorder_bench [rounds] [iters]");
    const auto e = StoreEnv::fromEnvironment();
    ddprun::rendezvous::StoreClientOptions options;
    options.host = e.master_addr;
    options.port = e.master_port;
    ddprun::rendezvous::TcpStoreClient store(options);
    HostBackendOptions on, off;
    on.flight_group = 1;
    off.flight_recorder = false;
    const auto timeout = std::chrono::seconds(60);
    HostBackend recording(store, "bench/fr/on/", e.rank, e.world_size, store.localAddress(), timeout, on);
    HostBackend plain(store, "bench/fr/off/", e.rank, e.world_size, store.localAddress(), timeout, off);
    if (!recording.flightRecorder().on() || plain.flightRecorder().on()) {
      throw std::runtime_error("the recorder must be on in one group and off in the other (DDPRUN_FLIGHT_RECORDER=0?)");
    }
    std::vector<float> buf(1024);  // 4 KiB
    int wrong_on = 0, wrong_off = 0;
    timeBlock(recording, buf, iters / 10 + 1, wrong_on);  // warm-up
    timeBlock(plain, buf, iters / 10 + 1, wrong_off);
    std::vector<double> t_on, t_off;
    for (int r = 0; r < rounds; ++r) {
      // Every rank alternates the same way: the groups' operations must pair up.
      if (r % 2 == 0) {
        t_on.push_back(timeBlock(recording, buf, iters, wrong_on));
        t_off.push_back(timeBlock(plain, buf, iters, wrong_off));
      } else {
        t_off.push_back(timeBlock(plain, buf, iters, wrong_off));
        t_on.push_back(timeBlock(recording, buf, iters, wrong_on));
      }
    }
    const double ns_per_op = recorderNsPerOp();
    if (e.rank == 0) {
      const double bytes = buf.size() * 4.0, n = e.world_size;
      std::printf("# flight recorder: %s, %d ranks, %d rounds of %d all_reduces per variant (median of rounds)\n",
                  recording.usesSharedMemory() ? "shared memory" : "TCP", e.world_size, rounds, iters);
      std::printf("%10s %10s %8s %10s %9s %12s %12s %6s %9s\n", "size(B)", "count", "type", "op", "time(us)",
                  "algbw(GB/s)", "busbw(GB/s)", "wrong", "recorder");
      for (auto [name, t, wrong] :
           {std::tuple{"on", median(t_on), wrong_on}, std::tuple{"off", median(t_off), wrong_off}}) {
        std::printf("%10.0f %10zu %8s %10s %9.2f %12.4f %12.4f %6d %9s\n", bytes, buf.size(), "float", "sum", t * 1e6,
                    bytes / t / 1e9, bytes / t / 1e9 * 2 * (n - 1) / n, wrong, name);
      }
      // The ratio of each round's two adjacent blocks, then their median: load that changes
      // slowly (other jobs on the machine) cancels within a round.
      std::vector<double> ratios;
      for (size_t r = 0; r < t_on.size(); ++r) ratios.push_back(t_on[r] / t_off[r]);
      const double on_s = median(t_on), off_s = median(t_off);
      std::printf(
          "flight_recorder bytes=%.0f on_us=%.3f off_us=%.3f ratio=%.4f recorder_ns_per_op=%.1f "
          "recorder_share=%.4f\n",
          bytes, on_s * 1e6, off_s * 1e6, median(ratios), ns_per_op, ns_per_op * 1e-9 / off_s);
      std::fflush(stdout);
    }
    return wrong_on + wrong_off == 0 ? 0 : 1;
  });
}
