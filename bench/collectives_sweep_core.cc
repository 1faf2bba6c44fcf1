#include "bench/collectives_sweep_core.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <sched.h>
#include <time.h>

namespace ddprun::bench {
namespace {

constexpr int kWarmups = 2;
constexpr int kMinIters = 5;
constexpr int kMaxIters = 20000;

// Small integers: every sum in the checks is exact in float32.
float pattern(size_t i) { return static_cast<float>(i % 13); }

size_t parseBytes(const std::string& text) {
  size_t pos = 0;
  const unsigned long long v = std::stoull(text, &pos);
  const std::string unit = text.substr(pos);
  if (unit.empty()) return v;
  if (unit == "K") return v << 10;
  if (unit == "M") return v << 20;
  if (unit == "G") return v << 30;
  throw std::invalid_argument("size '" + text + "' (a number with an optional K, M or G)");
}

// Whether `text` is a number of 1 to `max_digits` decimal digits.
bool isNumber(const std::string& text, size_t max_digits) {
  return !text.empty() && text.size() <= max_digits && text.find_first_not_of("0123456789") == std::string::npos;
}

// "0,1,1": CPU numbers, comma-separated.
std::vector<int> parseCpus(const std::string& text) {
  std::vector<int> cpus;
  std::stringstream list(text);
  for (std::string item; std::getline(list, item, ',');) {
    if (!isNumber(item, 4)) throw std::invalid_argument("--pin '" + text + "' (CPU numbers, comma-separated, as 0,1)");
    cpus.push_back(std::stoi(item));
  }
  if (cpus.empty() || text.back() == ',') {
    throw std::invalid_argument("--pin '" + text + "' (CPU numbers, comma-separated, as 0,1)");
  }
  return cpus;
}

// The CPUs this thread may run on, as "0,1".
std::string currentCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return "unknown";
  std::string list;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) list += (list.empty() ? "" : ",") + std::to_string(c);
  }
  return list;
}

// One op at one size: fills the inputs, runs it, checks the result.
struct Case {
  SweepOps& ops;
  std::string op;
  size_t count;  // elements per rank's block (all_gather, reduce_scatter) or of the buffer
  std::vector<float> in, out;

  Case(SweepOps& o, std::string name, size_t bytes) : ops(o), op(std::move(name)) {
    const int n = ops.size();
    const size_t elems = std::max<size_t>(1, bytes / sizeof(float));
    const bool blocked = op == "all_gather" || op == "reduce_scatter";
    count = blocked ? std::max<size_t>(1, elems / n) : elems;
    if (op == "barrier") count = 0;
    if (op == "all_reduce" || op == "broadcast") in.resize(count);
    if (op == "all_gather") in.resize(count), out.resize(count * n);
    if (op == "reduce_scatter") in.resize(count * n), out.resize(count);
  }

  size_t bytes() const {
    const bool blocked = op == "all_gather" || op == "reduce_scatter";
    return count * sizeof(float) * (blocked ? ops.size() : 1);
  }

  double busFactor() const {
    const double n = ops.size();
    if (op == "all_reduce") return 2 * (n - 1) / n;
    if (op == "all_gather" || op == "reduce_scatter") return (n - 1) / n;
    return 1;
  }

  void fill() {
    const int r = ops.rank(), n = ops.size();
    if (op == "all_reduce") {
      for (size_t i = 0; i < count; ++i) in[i] = pattern(i) + r;
    } else if (op == "broadcast") {
      for (size_t i = 0; i < count; ++i) in[i] = r == 0 ? pattern(i) + 1 : -1;
    } else if (op == "all_gather") {
      for (size_t i = 0; i < count; ++i) in[i] = pattern(i) + 16 * r;
      std::fill(out.begin(), out.end(), -1.f);
    } else if (op == "reduce_scatter") {
      for (int b = 0; b < n; ++b) {
        for (size_t i = 0; i < count; ++i) in[b * count + i] = pattern(i) + r + b;
      }
      std::fill(out.begin(), out.end(), -1.f);
    }
  }

  void run() {
    if (op == "all_reduce") ops.allReduce(in.data(), count);
    if (op == "broadcast") ops.broadcast(in.data(), count, 0);
    if (op == "all_gather") ops.allGather(in.data(), out.data(), count);
    if (op == "reduce_scatter") ops.reduceScatter(in.data(), out.data(), count);
    if (op == "barrier") ops.barrier();
  }

  // The index of the first wrong element, or -1.
  long long firstWrong() const {
    const int r = ops.rank(), n = ops.size();
    const float ranks_sum = static_cast<float>(n * (n - 1) / 2);
    if (op == "all_reduce") {
      for (size_t i = 0; i < count; ++i) {
        if (in[i] != n * pattern(i) + ranks_sum) return static_cast<long long>(i);
      }
    } else if (op == "broadcast") {
      for (size_t i = 0; i < count; ++i) {
        if (in[i] != pattern(i) + 1) return static_cast<long long>(i);
      }
    } else if (op == "all_gather") {
      for (int q = 0; q < n; ++q) {
        for (size_t i = 0; i < count; ++i) {
          if (out[q * count + i] != pattern(i) + 16 * q) return static_cast<long long>(q * count + i);
        }
      }
    } else if (op == "reduce_scatter") {
      for (size_t i = 0; i < count; ++i) {
        if (out[i] != n * pattern(i) + ranks_sum + static_cast<float>(n * r)) return static_cast<long long>(i);
      }
    }
    return -1;
  }

  double timedCall() {
    fill();
    ops.barrier();
    const auto start = std::chrono::steady_clock::now();
    run();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

}  // namespace

SweepOptions parseSweepArgs(int argc, char** argv) {
  SweepOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--impl") {
      o.impl = value();
    } else if (arg == "--ops") {
      o.ops.clear();
      std::stringstream list(value());
      for (std::string op; std::getline(list, op, ',');) o.ops.push_back(op);
    } else if (arg == "--min-bytes") {
      o.min_bytes = parseBytes(value());
    } else if (arg == "--max-bytes") {
      o.max_bytes = parseBytes(value());
    } else if (arg == "--full") {
      o.max_bytes = size_t{256} << 20;
    } else if (arg == "--wait-probe-ms") {
      o.wait_probe_ms = std::stoi(value());
    } else if (arg == "--seconds") {
      o.seconds_per_size = std::stod(value());
    } else if (arg == "--pin") {
      o.pin = parseCpus(value());
    } else {
      throw std::invalid_argument("unknown argument '" + arg + "'");
    }
  }
  for (const auto& op : o.ops) {
    if (op != "all_reduce" && op != "broadcast" && op != "all_gather" && op != "reduce_scatter" && op != "barrier") {
      throw std::invalid_argument("unknown op '" + op + "'");
    }
  }
  return o;
}

std::vector<size_t> sweepSizes(const SweepOptions& options) {
  std::vector<size_t> sizes;
  for (size_t b = 8; b <= options.max_bytes; b *= 4) {
    if (b >= options.min_bytes) sizes.push_back(b);
  }
  if (4096 >= options.min_bytes && 4096 <= options.max_bytes) sizes.push_back(4096);
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

void pinRank(const SweepOptions& options, const char* local_rank_var) {
  if (options.pin.empty()) return;
  const char* value = std::getenv(local_rank_var);
  if (value == nullptr) throw std::runtime_error(std::string("--pin: ") + local_rank_var + " is not set");
  const std::string rank = value;
  if (!isNumber(rank, 6)) {
    throw std::runtime_error(std::string("--pin: ") + local_rank_var + "='" + rank + "' is not a rank");
  }
  const int cpu = options.pin[std::stoul(rank) % options.pin.size()];
  cpu_set_t set;
  CPU_ZERO(&set);
  if (cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
  if (cpu >= CPU_SETSIZE || ::sched_setaffinity(0, sizeof set, &set) != 0) {
    throw std::runtime_error("--pin: cannot run rank " + rank + " on CPU " + std::to_string(cpu) +
                             " (not one of this host's, or not allowed here)");
  }
}

int runSweep(SweepOps& ops, const SweepOptions& options) {
  int wrong_total = 0;
  if (!options.pin.empty()) {
    // What the rank runs on now that its implementation started (which may bind ranks itself).
    std::printf("sweep_pinned impl=%s n=%d rank=%d cpus=%s\n", options.impl.c_str(), ops.size(), ops.rank(),
                currentCpus().c_str());
    std::fflush(stdout);
  }
  for (const auto& op : options.ops) {
    std::vector<size_t> sizes = op == "barrier" ? std::vector<size_t>{0} : sweepSizes(options);
    for (size_t size : sizes) {
      Case c(ops, op, size);
      std::vector<double> estimate(1, 0.0);
      for (int i = 0; i < kWarmups; ++i) estimate[0] = c.timedCall();
      ops.maxOverRanks(estimate);
      const int iters = static_cast<int>(std::clamp(std::ceil(options.seconds_per_size / std::max(estimate[0], 1e-9)),
                                                    double{kMinIters}, double{kMaxIters}));
      std::vector<double> times(iters);
      int wrong = 0;
      for (int i = 0; i < iters; ++i) {
        times[i] = c.timedCall();
        const long long bad = c.firstWrong();
        if (bad >= 0) {
          if (wrong == 0) {
            std::fprintf(stderr, "%s rank %d: %s bytes=%zu call %d: element %lld wrong\n", options.impl.c_str(),
                         ops.rank(), op.c_str(), c.bytes(), i, bad);
          }
          ++wrong;
        }
      }
      ops.maxOverRanks(times);
      std::vector<double> w(1, wrong);
      ops.maxOverRanks(w);
      std::sort(times.begin(), times.end());
      const double p50 = times[times.size() / 2];
      const double p90 = times[static_cast<size_t>(std::ceil(0.9 * times.size())) - 1];
      const double algbw = static_cast<double>(c.bytes()) / p50 / 1e9;
      if (ops.rank() == 0) {
        std::printf(
            "sweep_row impl=%s n=%d op=%s bytes=%zu count=%zu type=float iters=%d p50_us=%.2f p90_us=%.2f "
            "algbw_GBps=%.3f busbw_GBps=%.3f wrong=%d\n",
            options.impl.c_str(), ops.size(), op.c_str(), c.bytes(), c.bytes() / sizeof(float), iters, p50 * 1e6,
            p90 * 1e6, algbw, algbw * c.busFactor(), static_cast<int>(w[0]));
        std::fflush(stdout);
      }
      wrong_total += wrong;
    }
  }
  if (options.wait_probe_ms > 0) {
    std::vector<float> buf(1024, 1.f);
    ops.barrier();
    if (ops.rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(options.wait_probe_ms));
    timespec cpu0{}, cpu1{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu0);
    const auto start = std::chrono::steady_clock::now();
    ops.allReduce(buf.data(), buf.size());
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu1);
    const double cpu = (cpu1.tv_sec - cpu0.tv_sec) + (cpu1.tv_nsec - cpu0.tv_nsec) * 1e-9;
    if (buf[0] != static_cast<float>(ops.size())) ++wrong_total;
    if (ops.rank() == 0) {
      std::printf("sweep_wait impl=%s n=%d wait_ms=%d wall_ms=%.1f cpu_ms=%.1f\n", options.impl.c_str(), ops.size(),
                  options.wait_probe_ms, wall * 1e3, cpu * 1e3);
      std::fflush(stdout);
    }
  }
  return wrong_total;
}

}  // namespace ddprun::bench
