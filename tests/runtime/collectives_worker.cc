// A worker that checks the collectives of ddprun::dist against results it computes on its
// own. Every input is a function of (rank, index, dtype, salt), so each rank knows every
// rank's input and computes the expected output without any communication; values are
// small integers chosen per dtype and operator so that every sum, product, minimum and
// maximum is exact in every dtype (uint8, float16 and bfloat16 included). Only AVG on
// floating types is compared with a tolerance (one rounding of the division).
//
//   ddprun --standalone --nproc_per_node=4 --no_python ddprun_collectives_worker [flags]
//
//   --ops LIST          send_recv, isend_irecv, batch_p2p, broadcast, all_reduce, reduce, all_gather,
//                       gather, scatter, reduce_scatter, all_to_all, all_to_all_uneven,
//                       barrier, noncontig, async, or all (default)
//   --dtypes LIST       float32, float64, float16, bfloat16, int32, int64, uint8, or all (default);
//                       int8 by name (NCCL has it, the host backend not)
//   --reduce-ops LIST   SUM, PRODUCT, MIN, MAX, AVG, or all (default)
//   --sizes LIST        element counts (default 0,1,7)
//   --roots all|one     rooted collectives at sizes >= 1000: every rank, or one rank per
//                       combination, rotating (default one); small sizes always use every rank
//   --teams LIST        world (default), even, odd, reversed: groups from new_group (every rank
//                       creates each group; members run the matrix inside it)
//   --async MODE        never, always, alternate (default): async_op=true with is_completed
//                       polled before wait(), or wait() at once
//   --init URL --rank R --world-size N   tcp:// or file:// instead of env://
//   --timeout-s S       the process group's timeout (default 60)
//   --die-after-ms M --victim R --big-count C   rank R kills itself (SIGKILL) M ms into a
//                       loop of all_reduce on C floats (default 4M); the others must fail
//   --kill-op OP        that loop's collective: all_reduce (default) or all_gather (C floats
//                       per rank)
//   --linger-ms M       after a PeerError, wait M ms before exiting (connections stay open)
//   --self-test-corrupt OP   rank 0 adds 1 to the middle element of OP's first non-empty
//                       result before checking it: the check itself must catch that
//   --device D          where the tensors live: cpu (default), cuda (cuda:LOCAL_RANK modulo the
//                       visible devices; inputs are made on the host and moved, results moved
//                       back), or both (CPU and CUDA tensors in turns, op by op, in one group)
//   --backend B         init_process_group's backend (default auto): gloo runs CUDA tensors
//                       through host copies, nccl or cpu:gloo,cuda:nccl through NCCL
//   --group-backend B   new_group's backend for the --teams groups (default: the default group's)
//   --verbose           print the group's backend (get_backend, get_default_device) and each op's time on the
//                       team's first rank
//   --flight-summary    at the end, read this rank's flight recorder rings of the default group
//                       (in DDPRUN_FLIGHT_DIR) and print one line each: "flight rank R: OP DTYPE xN, ...
//                       pending=K" for the collectives, "flight p2p rank R: OP DTYPE n=COUNT peer=P xN,
//                       ... pending=K" for the messages: the labels ddprun::dist gave what it recorded
//
// Exit codes: 0 every check passed; 1 a mismatch (one line: MISMATCH op=... reduce=...
// dtype=... size=... rank=... index=... got=... expected=...) or another error; 3 a
// PeerError ("peer error: <message>"); 4 the killed-peer loop saw no error.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>

#include "common/flight_ring.h"
#include "worker_runtime/distributed.h"
#include "worker_runtime/env_contract.h"
#include "worker_runtime/error_record.h"

namespace dist = ddprun::dist;
using at::Tensor;
using dist::ReduceOp;
using namespace std::chrono_literals;

namespace {

// A result differs from the expected one; the message is the one line to print.
class Mismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr int64_t kBigSize = 1000;  // from here on, rooted collectives use one root (--roots one)

const std::vector<std::string> kAllOps = {"send_recv",  "isend_irecv",       "batch_p2p", "broadcast", "all_reduce",
                                          "reduce",     "all_gather",        "gather",    "scatter",   "reduce_scatter",
                                          "all_to_all", "all_to_all_uneven", "barrier",   "noncontig", "async"};
const std::vector<std::pair<std::string, at::ScalarType>> kAllDtypes = {
    {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
    {"int32", at::kInt},     {"int64", at::kLong},     {"uint8", at::kByte}};
const std::vector<std::pair<std::string, ReduceOp>> kAllReduceOps = {{"SUM", ReduceOp::SUM},
                                                                     {"PRODUCT", ReduceOp::PRODUCT},
                                                                     {"MIN", ReduceOp::MIN},
                                                                     {"MAX", ReduceOp::MAX},
                                                                     {"AVG", ReduceOp::AVG}};

std::string dtypeName(at::ScalarType t) {
  for (const auto& [name, type] : kAllDtypes) {
    if (type == t) return name;
  }
  return t == at::kChar ? "int8" : "?";
}

std::string opName(ReduceOp op) {
  for (const auto& [name, o] : kAllReduceOps) {
    if (o == op) return name;
  }
  return "?";
}

bool isFloating(at::ScalarType t) { return at::isFloatingType(t); }

struct Options {
  std::vector<std::string> ops = kAllOps;
  std::vector<at::ScalarType> dtypes;
  std::vector<ReduceOp> reduce_ops;
  std::vector<int64_t> sizes = {0, 1, 7};
  bool all_roots = false;
  std::vector<std::string> teams = {"world"};
  std::string async = "alternate";
  std::string init = "env://";
  int rank = -1;
  int world_size = -1;
  double timeout_s = 60;
  int die_after_ms = -1;
  int victim = -1;
  int64_t big_count = 4 << 20;
  int linger_ms = 0;
  std::string kill_op = "all_reduce";
  std::string corrupt_op;  // self-test: rank 0 sees one element of this op's first result off by one
  bool verbose = false;
  bool flight_summary = false;
  std::string device = "cpu";
  std::string backend = "auto";
  std::string group_backend;  // new_group's backend; empty: the default group's
};

// Where the tensors of the ops live (--device), and whether their backend has torch's stream
// semantics (NCCL: a blocking call's Work may still be running on the GPU when it returns).
at::Device g_device(at::kCPU);
at::Device g_cuda_device(at::kCUDA, 0);  // this rank's device, with --device cuda or both
bool g_stream_semantics = false;

std::vector<std::string> splitList(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

Options parse(int argc, char** argv) {
  Options o;
  for (const auto& [name, type] : kAllDtypes) o.dtypes.push_back(type);
  for (const auto& [name, op] : kAllReduceOps) o.reduce_ops.push_back(op);
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--verbose") {
      o.verbose = true;
      continue;
    }
    if (flag == "--flight-summary") {
      o.flight_summary = true;
      continue;
    }
    if (i + 1 >= argc) throw UsageError("flag " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--ops") {
      o.ops = value == "all" ? kAllOps : splitList(value);
      for (const auto& op : o.ops) {
        if (std::find(kAllOps.begin(), kAllOps.end(), op) == kAllOps.end()) throw UsageError("unknown op " + op);
      }
    } else if (flag == "--dtypes") {
      if (value == "all") continue;
      o.dtypes.clear();
      for (const auto& name : splitList(value)) {
        if (name == "int8") {  // NCCL has it, the host backend does not: asked for by name only
          o.dtypes.push_back(at::kChar);
          continue;
        }
        auto it = std::find_if(kAllDtypes.begin(), kAllDtypes.end(), [&](const auto& d) { return d.first == name; });
        if (it == kAllDtypes.end()) throw UsageError("unknown dtype " + name);
        o.dtypes.push_back(it->second);
      }
    } else if (flag == "--reduce-ops") {
      if (value == "all") continue;
      o.reduce_ops.clear();
      for (const auto& name : splitList(value)) {
        auto it =
            std::find_if(kAllReduceOps.begin(), kAllReduceOps.end(), [&](const auto& d) { return d.first == name; });
        if (it == kAllReduceOps.end()) throw UsageError("unknown reduce op " + name);
        o.reduce_ops.push_back(it->second);
      }
    } else if (flag == "--sizes") {
      o.sizes.clear();
      for (const auto& s : splitList(value)) o.sizes.push_back(std::stoll(s));
    } else if (flag == "--roots") {
      if (value != "all" && value != "one") throw UsageError("--roots takes all or one");
      o.all_roots = value == "all";
    } else if (flag == "--teams") {
      o.teams = splitList(value);
      for (const auto& t : o.teams) {
        if (t != "world" && t != "even" && t != "odd" && t != "reversed") throw UsageError("unknown team " + t);
      }
    } else if (flag == "--async") {
      if (value != "never" && value != "always" && value != "alternate") throw UsageError("bad --async " + value);
      o.async = value;
    } else if (flag == "--init") {
      o.init = value;
    } else if (flag == "--rank") {
      o.rank = std::stoi(value);
    } else if (flag == "--world-size") {
      o.world_size = std::stoi(value);
    } else if (flag == "--timeout-s") {
      o.timeout_s = std::stod(value);
    } else if (flag == "--die-after-ms") {
      o.die_after_ms = std::stoi(value);
    } else if (flag == "--victim") {
      o.victim = std::stoi(value);
    } else if (flag == "--big-count") {
      o.big_count = std::stoll(value);
    } else if (flag == "--self-test-corrupt") {
      o.corrupt_op = value;
    } else if (flag == "--device") {
      if (value != "cpu" && value != "cuda" && value != "both") throw UsageError("--device is cpu, cuda or both");
      o.device = value;
    } else if (flag == "--backend") {
      o.backend = value;
    } else if (flag == "--group-backend") {
      o.group_backend = value;
    } else if (flag == "--linger-ms") {
      o.linger_ms = std::stoi(value);
    } else if (flag == "--kill-op") {
      if (value != "all_reduce" && value != "all_gather") throw UsageError("--kill-op: all_reduce or all_gather");
      o.kill_op = value;
    } else {
      throw UsageError("unknown flag " + flag);
    }
  }
  return o;
}

int64_t monotonicNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);  // one clock for every process on the host
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Time spent computing inputs and expected results and comparing (for --verbose): what
// is not the collectives themselves.
double g_local_seconds = 0;
int g_local_depth = 0;
struct LocalTimer {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  LocalTimer() { ++g_local_depth; }
  ~LocalTimer() {
    if (--g_local_depth == 0) {
      g_local_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  }
};

// fn(n) for a function of the index with period `period`: computed on one period and tiled,
// so large expected results cost little more than the comparison.
template <class Fn>
Tensor periodic(int64_t period, int64_t n, Fn fn) {
  if (n <= period) return fn(n);
  return fn(period).repeat({(n + period - 1) / period}).narrow(0, 0, n);
}

// ---- inputs: int64 tensors of exactly representable values ----

// Data for collectives that move data: distinct per rank, index and salt; the range uses
// the dtype's exact integers (beyond 32 bits for int64 and float64).
Tensor dataValues(at::ScalarType dt, int64_t rank, int64_t n, int64_t salt) {
  LocalTimer timer;
  const int64_t offset = rank * 1000003 + salt * 104729;
  auto mod = [&](int64_t m, int64_t shift) {
    return periodic(m, n, [&](int64_t k) { return (at::arange(k, at::kLong) * 7919 + offset).remainder(m) - shift; });
  };
  switch (dt) {
    case at::kByte: return mod(251, 0);
    case at::kChar: return mod(251, 125);
    case at::kHalf: return mod(2048, 1024);
    case at::kBFloat16: return mod(256, 128);
    case at::kFloat: return mod(1 << 24, 1 << 23);
    case at::kInt: return mod(2147483647, 1073741823);
    default: return (at::arange(n, at::kLong) * 7919 + offset) * 4099;  // int64, float64: up to ~2^48, exact in double
  }
}

// Inputs of reductions. SUM/AVG: -4..4 (0..8 for uint8); PRODUCT: mostly 1, at most two
// ranks hold 2 at an index, some -1 and 0; MIN/MAX: -11..11 (200..222 for uint8).
Tensor reduceValues(ReduceOp op, at::ScalarType dt, int64_t rank, int64_t n, int64_t salt) {
  LocalTimer timer;
  const bool has_sign = dt != at::kByte;
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG:
      return periodic(9, n, [&](int64_t k) {
        Tensor v = (at::arange(k, at::kLong) * 3 + (rank * 7 + salt)).remainder(9);
        return has_sign ? v - 4 : v;
      });
    case ReduceOp::PRODUCT:
      return periodic(7 * 11 * 29, n, [&](int64_t k) {
        Tensor idx = at::arange(k, at::kLong);
        Tensor v = (idx * 5 + (rank + salt)).remainder(7).eq(0).to(at::kLong) + 1;
        if (has_sign) v = v * (1 - 2 * (idx * 3 + (rank * 2 + salt)).remainder(11).eq(0).to(at::kLong));
        return v * (1 - (idx + (rank * 3 + salt)).remainder(29).eq(0).to(at::kLong));
      });
    case ReduceOp::MIN:
    case ReduceOp::MAX:
      return periodic(23, n, [&](int64_t k) {
        Tensor v = (at::arange(k, at::kLong) * 7 + (rank * 13 + salt * 5)).remainder(23);
        return has_sign ? v - 11 : v + 200;
      });
  }
  throw std::logic_error("reduce op");
}

// The period of reduceValues() in the index.
int64_t reducePeriod(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG: return 9;
    case ReduceOp::PRODUCT: return 7 * 11 * 29;
    default: return 23;
  }
}

// The expected reduction over `ranks`, as float64 (exact for every value used here).
Tensor expectedReduce(ReduceOp op, at::ScalarType dt, const std::vector<int>& ranks, int64_t n, int64_t salt) {
  LocalTimer timer;
  if (n > reducePeriod(op)) {
    return periodic(reducePeriod(op), n, [&](int64_t k) { return expectedReduce(op, dt, ranks, k, salt); });
  }
  Tensor acc;
  for (int r : ranks) {
    Tensor v = reduceValues(op, dt, r, n, salt);
    if (!acc.defined()) {
      acc = v;
      continue;
    }
    switch (op) {
      case ReduceOp::SUM:
      case ReduceOp::AVG: acc = acc + v; break;
      case ReduceOp::PRODUCT: acc = acc * v; break;
      case ReduceOp::MIN: acc = at::minimum(acc, v); break;
      case ReduceOp::MAX: acc = at::maximum(acc, v); break;
    }
  }
  const auto count = static_cast<int64_t>(ranks.size());
  if (op == ReduceOp::AVG) {
    if (!isFloating(dt)) return at::div(acc, count, "trunc").to(at::kDouble);
    return acc.to(at::kDouble) / static_cast<double>(count);
  }
  return acc.to(at::kDouble);
}

// Relative tolerance of AVG on a floating type: one rounding of the quotient.
double avgTolerance(at::ScalarType dt) {
  switch (dt) {
    case at::kHalf: return 1.0 / 1024;
    case at::kBFloat16: return 1.0 / 128;
    case at::kFloat: return 1.0 / (1 << 22);
    case at::kDouble: return 1e-15;
    default: return 0;
  }
}

// ---- teams (the default group or a subgroup) and the checks ----

struct Team {
  std::string name;
  dist::Group group;       // empty: the default group
  std::vector<int> ranks;  // global ranks in group-rank order
  int me = 0;              // this rank's index in `ranks`
  int size() const { return static_cast<int>(ranks.size()); }
  int global() const { return ranks[me]; }
  // This rank's neighbours in the team's ring (global ranks).
  int left() const { return ranks[(me + size() - 1) % size()]; }
  int right() const { return ranks[(me + 1) % size()]; }
};

struct Case {
  std::string op;
  std::string reduce = "-";
  at::ScalarType dtype = at::kFloat;
  int64_t size = 0;
  std::string detail;  // team, root, block, ...
};

class Checker {
 public:
  Checker(const Options& options, int world_rank) : o_(options), world_rank_(world_rank) {}

  int64_t checks() const { return checks_; }

  // got == expected (expected as float64), element by element; the first difference throws.
  void expect(const Tensor& got, const Tensor& expected, const Case& c, const std::string& what, double tol = 0) {
    LocalTimer timer;
    Tensor g = got.reshape({-1}).to(at::kCPU).to(at::kDouble);
    Tensor e = expected.reshape({-1}).to(at::kCPU).to(at::kDouble);
    if (g.numel() != e.numel()) {
      throw Mismatch(fmt::format("MISMATCH {} {}: got {} elements, expected {}", label(c), what, g.numel(), e.numel()));
    }
    ++checks_;
    if (g.numel() == 0) return;
    if (c.op == o_.corrupt_op && world_rank_ == 0 && !corrupted_) {
      corrupted_ = true;
      g = g.clone();
      g[g.numel() / 2] += 1;
    }
    // NaN is expected only where a sentinel must stay untouched.
    Tensor bad = tol == 0 ? g.ne(e) : (g - e).abs().gt(e.abs().clamp_min(1) * tol).logical_or(g.isnan());
    bad.logical_and_(g.isnan().logical_and(e.isnan()).logical_not());
    if (!bad.any().item<bool>()) return;
    const int64_t i = bad.nonzero()[0][0].item<int64_t>();
    throw Mismatch(fmt::format("MISMATCH {} index={} got={} expected={} ({}; {} of {} elements differ)", label(c), i,
                               g[i].item<double>(), e[i].item<double>(), what, bad.sum().item<int64_t>(), g.numel()));
  }

  void require(bool ok, const Case& c, const std::string& what) {
    ++checks_;
    if (!ok) throw Mismatch(fmt::format("MISMATCH {}: {}", label(c), what));
  }

  // Completes a collective's Work the way this combination asks: blocking, async waited at
  // once, or async polled with is_completed() until done; then checks its state.
  void settle(const dist::WorkPtr& work, bool async_op, bool poll, const Case& c) {
    require(work != nullptr, c, "returned no Work");
    if (!async_op) {
      // On NCCL a blocking call returns once the caller's stream is ordered after the op, as
      // in torch: the Work need not be done yet.
      if (!g_stream_semantics) require(work->isCompleted(), c, "a blocking call returned a Work that is not completed");
    } else if (poll) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o_.timeout_s) + 30s;
      while (!work->isCompleted()) {
        if (std::chrono::steady_clock::now() > deadline) {
          throw Mismatch(fmt::format("MISMATCH {}: async Work never completed ({} s past the timeout)", label(c), 30));
        }
        std::this_thread::sleep_for(100us);
      }
    }
    work->wait();
    // On NCCL wait() only orders the caller's stream (torch's semantics): the Work is done once
    // that stream has run up to here.
    if (g_stream_semantics) syncCurrentStream();
    require(work->isCompleted() && work->isSuccess(), c, "wait() returned but the Work is not a success");
  }

  // Blocks until this rank's current CUDA stream has run what was queued on it (torch's
  // torch.cuda.current_stream().synchronize(), without CUDA headers in this worker).
  static void syncCurrentStream() {
    const auto* cuda = c10::impl::getDeviceGuardImpl(at::kCUDA);
    cuda->synchronizeStream(cuda->getStream(g_cuda_device));
  }

  std::string label(const Case& c) const {
    return fmt::format("op={} reduce={} dtype={} size={} rank={}{}{}", c.op, c.reduce, dtypeName(c.dtype), c.size,
                       world_rank_, c.detail.empty() ? "" : " ", c.detail);
  }

 private:
  const Options& o_;
  int world_rank_;
  int64_t checks_ = 0;
  bool corrupted_ = false;
};

class Suite {
 public:
  Suite(const Options& o, Checker& check) : o_(o), check_(check) {}

  void run(const Team& t, const std::string& op) {
    if (op == "send_recv") return sendRecv(t);
    if (op == "isend_irecv") return isendIrecv(t);
    if (op == "batch_p2p") return batchP2P(t);
    if (op == "broadcast") return broadcast(t);
    if (op == "all_reduce") return allReduce(t);
    if (op == "reduce") return reduce(t);
    if (op == "all_gather") return allGather(t);
    if (op == "gather") return gather(t);
    if (op == "scatter") return scatter(t);
    if (op == "reduce_scatter") return reduceScatter(t);
    if (op == "all_to_all") return allToAll(t, false);
    if (op == "all_to_all_uneven") return allToAll(t, true);
    if (op == "barrier") return barrier(t);
    if (op == "noncontig") return nonContiguous(t);
    if (op == "async") return asyncQueue(t);
    throw UsageError("unknown op " + op);
  }

 private:
  // Each combination gets its own salt (so a stale buffer cannot pass) and its async mode.
  struct Mode {
    int64_t salt;
    bool async_op;
    bool poll;
    int64_t serial;
  };
  Mode next() {
    const int64_t k = combo_++;
    bool async_op = o_.async == "always" || (o_.async == "alternate" && k % 2 == 1);
    return Mode{(k * 37) % 5000, async_op, k % 4 == 3 || (o_.async == "always" && k % 2 == 1), k};
  }

  std::vector<int> roots(const Team& t, int64_t n, int64_t serial) const {
    if (n < kBigSize || o_.all_roots) return t.ranks;
    return {t.ranks[serial % t.size()]};
  }

  static std::string detail(const Team& t, const std::string& extra = "") {
    std::string d = "team=" + t.name;
    if (!extra.empty()) d += " " + extra;
    return d;
  }

  Tensor data(at::ScalarType dt, int64_t rank, int64_t n, int64_t salt) {
    return dataValues(dt, rank, n, salt).to(g_device, dt);
  }
  // A buffer the collective must overwrite, with values no rank ever sends: NaN for floating
  // types, outside dataValues()' range for integers.
  static Tensor sentinel(at::ScalarType dt, int64_t n) {
    Tensor idx = at::arange(n, at::kLong);
    switch (dt) {
      case at::kByte: return (idx.remainder(5) + 251).to(g_device, dt);
      case at::kChar: return (idx.remainder(5) - 128).to(g_device, dt);
      case at::kInt: return (idx.remainder(1000) + std::numeric_limits<int32_t>::min()).to(g_device, dt);
      case at::kLong: return (-1 - idx * 3).to(g_device, dt);
      default:
        return at::full({n}, std::numeric_limits<double>::quiet_NaN(), at::TensorOptions().dtype(dt).device(g_device));
    }
  }

  void sendRecv(const Team& t) {
    if (t.size() < 2) return;
    const int left = t.left();
    const int right = t.right();
    for (auto dt : o_.dtypes) {
      for (int64_t n : o_.sizes) {
        const Mode m = next();
        const int tag = static_cast<int>(m.serial % 1000) + 1;
        Case c{"send_recv", "-", dt, n, detail(t)};
        // Around the ring to the right, then to the left: the team's first rank sends first,
        // the others receive first, so blocking calls cannot deadlock.
        for (int direction = 0; direction < 2; ++direction) {
          const int to = direction == 0 ? right : left;
          const int from = direction == 0 ? left : right;
          Tensor out = data(dt, t.global(), n, m.salt + direction);
          Tensor in = sentinel(dt, n);
          int src = -1;
          if (t.me == 0) {
            dist::send(out, to, t.group, tag + direction);
            src = dist::recv(in, from, t.group, tag + direction);
          } else {
            src = dist::recv(in, from, t.group, tag + direction);
            dist::send(out, to, t.group, tag + direction);
          }
          c.detail = detail(t, fmt::format("from={} direction={}", from, direction == 0 ? "right" : "left"));
          check_.require(src == from, c, fmt::format("recv returned src {}", src));
          check_.expect(in, dataValues(dt, from, n, m.salt + direction), c, "received data");
          check_.expect(out, dataValues(dt, t.global(), n, m.salt + direction), c, "the sent tensor changed");
        }
      }
    }
  }

  void isendIrecv(const Team& t) {
    if (t.size() < 2) return;
    const int left = t.left();
    const int right = t.right();
    for (auto dt : o_.dtypes) {
      for (int64_t n : o_.sizes) {
        const Mode m = next();
        const int tag_right = static_cast<int>(m.serial % 1000) * 2 + 1;
        const int tag_left = tag_right + 1;
        Case c{"isend_irecv", "-", dt, n, detail(t, fmt::format("left={} right={}", left, right))};
        RingExchange x = ringExchange(t, dt, n, m.salt);
        if (g_stream_semantics) {
          // On NCCL every op of a rank runs in issue order on one stream, as in torch: a
          // receive queued before a send waits for the peer's send. So one direction at a time,
          // the team's first rank sending first and the others receiving first.
          for (int direction = 0; direction < 2; ++direction) {
            Tensor& out = direction == 0 ? x.to_right : x.to_left;
            Tensor& in = direction == 0 ? x.from_left : x.from_right;
            const int to = direction == 0 ? right : left, from = direction == 0 ? left : right;
            const int tag = direction == 0 ? tag_right : tag_left;
            dist::WorkPtr s, r;
            if (t.me == 0) {
              s = dist::isend(out, to, t.group, tag);
              r = dist::irecv(in, from, t.group, tag);
            } else {
              r = dist::irecv(in, from, t.group, tag);
              s = dist::isend(out, to, t.group, tag);
            }
            for (const auto& w : {s, r}) check_.settle(w, true, m.poll, c);
          }
        } else {
          // Both directions at once: receives posted first, then sends, all waited together.
          auto r1 = dist::irecv(x.from_left, left, t.group, tag_right);
          auto r2 = dist::irecv(x.from_right, right, t.group, tag_left);
          auto s1 = dist::isend(x.to_right, right, t.group, tag_right);
          auto s2 = dist::isend(x.to_left, left, t.group, tag_left);
          for (const auto& w : {s1, s2, r1, r2}) check_.settle(w, true, m.poll, c);
        }
        expectRingReceived(x, t, dt, n, m.salt, c);
      }
    }
  }

  // One message each way around the team's ring: this rank's data to the right (salt) and to
  // the left (salt + 1), and sentinels for what comes from each side.
  struct RingExchange {
    Tensor from_left, from_right, to_right, to_left;
  };
  RingExchange ringExchange(const Team& t, at::ScalarType dt, int64_t n, int64_t salt) {
    return {sentinel(dt, n), sentinel(dt, n), data(dt, t.global(), n, salt), data(dt, t.global(), n, salt + 1)};
  }
  // What came from each side is what that neighbour sent this way.
  void expectRingReceived(const RingExchange& x, const Team& t, at::ScalarType dt, int64_t n, int64_t salt,
                          const Case& c) {
    check_.expect(x.from_left, dataValues(dt, t.left(), n, salt), c, "received from the left");
    check_.expect(x.from_right, dataValues(dt, t.right(), n, salt + 1), c, "received from the right");
  }

  // batch_isend_irecv: both receives listed before both sends, on every rank (the order that
  // would wait forever on NCCL's one stream as separate ops), each Work settled.
  void batchP2P(const Team& t) {
    if (t.size() < 2) return;
    const int left = t.left();
    const int right = t.right();
    for (auto dt : o_.dtypes) {
      for (int64_t n : o_.sizes) {
        const Mode m = next();
        const int tag = static_cast<int>(m.serial % 1000) * 2 + 1;
        Case c{"batch_p2p", "-", dt, n, detail(t, fmt::format("left={} right={}", left, right))};
        RingExchange x = ringExchange(t, dt, n, m.salt);
        using Kind = dist::P2POp::Kind;
        const std::vector<dist::P2POp> ops = {{Kind::kRecv, x.from_left, left, t.group, tag},
                                              {Kind::kRecv, x.from_right, right, t.group, tag + 1},
                                              {Kind::kSend, x.to_right, right, t.group, tag},
                                              {Kind::kSend, x.to_left, left, t.group, tag + 1}};
        const auto works = dist::batch_isend_irecv(ops);
        check_.require(works.size() == ops.size(), c, fmt::format("{} Works for {} operations", works.size(), 4));
        for (const auto& w : works) check_.settle(w, true, m.poll, c);
        expectRingReceived(x, t, dt, n, m.salt, c);
      }
    }
    // Refused at once, before anything is posted (so no peer is left waiting).
    Case c{"batch_p2p", "-", at::kFloat, 1, detail(t, "bad lists")};
    Tensor one = sentinel(at::kFloat, 1);
    check_.require(
        refusal([&] { dist::batch_isend_irecv({}); }).find("the list of operations is empty") != std::string::npos, c,
        "an empty list was not refused");
    const std::string self = refusal([&] {
      dist::batch_isend_irecv({{dist::P2POp::Kind::kSend, one, right, t.group, 1},
                               {dist::P2POp::Kind::kSend, one, t.global(), t.group, 1}});
    });
    check_.require(self.find("operation 1 has this rank") != std::string::npos, c,
                   "a list with this rank as a peer was not refused: " + self);
  }

  // The message of what `body` throws ("" when it throws nothing).
  static std::string refusal(const std::function<void()>& body) {
    try {
      body();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }

  void broadcast(const Team& t) {
    for (auto dt : o_.dtypes) {
      for (int64_t n : o_.sizes) {
        const Mode m = next();
        for (int root : roots(t, n, m.serial)) {
          Case c{"broadcast", "-", dt, n, detail(t, fmt::format("src={}", root))};
          Tensor x = t.global() == root ? data(dt, root, n, m.salt) : sentinel(dt, n);
          check_.settle(dist::broadcast(x, root, t.group, m.async_op), m.async_op, m.poll, c);
          check_.expect(x, dataValues(dt, root, n, m.salt), c, "broadcast data");
        }
      }
    }
  }

  void allReduce(const Team& t) {
    for (auto dt : o_.dtypes) {
      for (int64_t n : o_.sizes) {
        for (ReduceOp op : o_.reduce_ops) {
          const Mode m = next();
          Case c{"all_reduce", opName(op), dt, n, detail(t)};
          Tensor x = reduceValues(op, dt, t.global(), n, m.salt).to(g_device, dt);
          check_.settle(dist::all_reduce(x, op, t.group, m.async_op), m.async_op, m.poll, c);
          check_.expect(x, expectedReduce(op, dt, t.ranks, n, m.salt), c, "reduced",
                        op == ReduceOp::AVG ? avgTolerance(dt) : 0);
        }
      }
    }
  }

  void reduce(const Team& t) {
    for (auto dt : o_.dtypes) {
      for (int64_t n : o_.sizes) {
        for (ReduceOp op : o_.reduce_ops) {
          const Mode m = next();
          for (int root : roots(t, n, m.serial)) {
            Case c{"reduce", opName(op), dt, n, detail(t, fmt::format("dst={}", root))};
            Tensor x = reduceValues(op, dt, t.global(), n, m.salt).to(g_device, dt);
            check_.settle(dist::reduce(x, root, op, t.group, m.async_op), m.async_op, m.poll, c);
            if (t.global() == root) {
              check_.expect(x, expectedReduce(op, dt, t.ranks, n, m.salt), c, "reduced on dst",
                            op == ReduceOp::AVG ? avgTolerance(dt) : 0);
            } else {
              check_.expect(x, reduceValues(op, dt, t.global(), n, m.salt), c, "a non-dst buffer changed");
            }
          }
        }
      }
    }
  }

  void allGather(const Team& t) {
    for (auto dt : o_.dtypes) {
      for (int64_t n : o_.sizes) {
        const Mode m = next();
        Case c{"all_gather", "-", dt, n, detail(t)};
        std::vector<Tensor> out;
        for (int i = 0; i < t.size(); ++i) out.push_back(sentinel(dt, n));
        Tensor in = data(dt, t.global(), n, m.salt);
        check_.settle(dist::all_gather(out, in, t.group, m.async_op), m.async_op, m.poll, c);
        for (int i = 0; i < t.size(); ++i) {
          c.detail = detail(t, fmt::format("block={}", i));
          check_.expect(out[i], dataValues(dt, t.ranks[i], n, m.salt), c, "gathered block");
        }
        check_.expect(in, dataValues(dt, t.global(), n, m.salt), c, "the input changed");
      }
    }
  }

  void gather(const Team& t) {
    for (auto dt : o_.dtypes) {
      for (int64_t n : o_.sizes) {
        const Mode m = next();
        for (int root : roots(t, n, m.serial)) {
          Case c{"gather", "-", dt, n, detail(t, fmt::format("dst={}", root))};
          std::vector<Tensor> out;
          const bool is_root = t.global() == root;
          if (is_root) {
            for (int i = 0; i < t.size(); ++i) out.push_back(sentinel(dt, n));
          }
          Tensor in = data(dt, t.global(), n, m.salt);
          check_.settle(dist::gather(in, is_root ? &out : nullptr, root, t.group, m.async_op), m.async_op, m.poll, c);
          for (int i = 0; is_root && i < t.size(); ++i) {
            c.detail = detail(t, fmt::format("dst={} block={}", root, i));
            check_.expect(out[i], dataValues(dt, t.ranks[i], n, m.salt), c, "gathered block");
          }
          check_.expect(in, dataValues(dt, t.global(), n, m.salt), c, "the input changed");
        }
      }
    }
  }

  void scatter(const Team& t) {
    for (auto dt : o_.dtypes) {
      for (int64_t n : o_.sizes) {
        const Mode m = next();
        for (int root : roots(t, n, m.serial)) {
          Case c{"scatter", "-", dt, n, detail(t, fmt::format("src={}", root))};
          // Block i of the root's list is meant for ranks[i]; its values name both ends.
          const int64_t salt = m.salt + 11 * root;
          std::vector<Tensor> in;
          const bool is_root = t.global() == root;
          if (is_root) {
            for (int i = 0; i < t.size(); ++i) in.push_back(data(dt, t.ranks[i], n, salt));
          }
          Tensor out = sentinel(dt, n);
          check_.settle(dist::scatter(out, is_root ? &in : nullptr, root, t.group, m.async_op), m.async_op, m.poll, c);
          check_.expect(out, dataValues(dt, t.global(), n, salt), c, "scattered block");
        }
      }
    }
  }

  void reduceScatter(const Team& t) {
    for (auto dt : o_.dtypes) {
      for (int64_t n : o_.sizes) {
        for (ReduceOp op : o_.reduce_ops) {
          const Mode m = next();
          Case c{"reduce_scatter", opName(op), dt, n, detail(t)};
          // Block j of every rank's list is reduced into ranks[j]'s output.
          std::vector<Tensor> in;
          for (int j = 0; j < t.size(); ++j)
            in.push_back(reduceValues(op, dt, t.global(), n, m.salt + 17 * j).to(g_device, dt));
          Tensor out = sentinel(dt, n);
          check_.settle(dist::reduce_scatter(out, in, op, t.group, m.async_op), m.async_op, m.poll, c);
          check_.expect(out, expectedReduce(op, dt, t.ranks, n, m.salt + 17 * t.me), c, "reduced block",
                        op == ReduceOp::AVG ? avgTolerance(dt) : 0);
          if (op == ReduceOp::SUM && t.size() > 1) reduceScatterOntoInputs(t, dt, n, c);
        }
      }
    }
  }

  // The output as one of the inputs: this rank's own block (in place), then the next rank's
  // block, which must still be sent as it was.
  void reduceScatterOntoInputs(const Team& t, at::ScalarType dt, int64_t n, const Case& c) {
    for (int onto : {t.me, (t.me + 1) % t.size()}) {
      const Mode m = next();
      std::vector<Tensor> in;
      for (int j = 0; j < t.size(); ++j)
        in.push_back(reduceValues(ReduceOp::SUM, dt, t.global(), n, m.salt + 17 * j).to(g_device, dt));
      Tensor out = in[onto];
      check_.settle(dist::reduce_scatter(out, in, ReduceOp::SUM, t.group, m.async_op), m.async_op, m.poll, c);
      check_.expect(out, expectedReduce(ReduceOp::SUM, dt, t.ranks, n, m.salt + 17 * t.me), c,
                    onto == t.me ? "reduced block in place" : "reduced block onto the next rank's input");
    }
  }

  static int64_t unevenCount(int64_t n, int src, int dst) { return n + (src * 3 + dst * 5) % 4; }

  void allToAll(const Team& t, bool uneven) {
    for (auto dt : o_.dtypes) {
      for (int64_t n : o_.sizes) {
        const Mode m = next();
        Case c{uneven ? "all_to_all_uneven" : "all_to_all", "-", dt, n, detail(t)};
        // The block from rank s to rank d holds data(s, salt + 31 d).
        auto count = [&](int src, int dst) { return uneven ? unevenCount(n, src, dst) : n; };
        std::vector<Tensor> in, out;
        for (int j = 0; j < t.size(); ++j) {
          in.push_back(data(dt, t.global(), count(t.global(), t.ranks[j]), m.salt + 31 * t.ranks[j]));
          out.push_back(sentinel(dt, count(t.ranks[j], t.global())));
        }
        check_.settle(dist::all_to_all(out, in, t.group, m.async_op), m.async_op, m.poll, c);
        for (int j = 0; j < t.size(); ++j) {
          c.detail = detail(t, fmt::format("block={} from={} count={}", j, t.ranks[j], count(t.ranks[j], t.global())));
          check_.expect(out[j], dataValues(dt, t.ranks[j], count(t.ranks[j], t.global()), m.salt + 31 * t.global()), c,
                        "block received");
        }
      }
    }
  }

  // No rank leaves a barrier before every rank entered it (one host clock for all).
  void barrier(const Team& t) {
    for (int round = 0; round < 4; ++round) {
      const Mode m = next();
      Case c{"barrier", "-", at::kLong, 0, detail(t, fmt::format("round={}", round))};
      std::this_thread::sleep_for(std::chrono::milliseconds(3 * ((t.me + round) % t.size())));
      const int64_t entered = monotonicNs();
      check_.settle(dist::barrier(t.group, m.async_op), m.async_op, m.poll, c);
      const int64_t left = monotonicNs();
      std::vector<Tensor> times;
      for (int i = 0; i < t.size(); ++i)
        times.push_back(at::zeros({2}, at::TensorOptions().dtype(at::kLong).device(g_device)));
      Tensor mine = at::tensor(std::vector<int64_t>{entered, left}, at::kLong).to(g_device);
      dist::all_gather(times, mine, t.group);
      for (int i = 0; i < t.size(); ++i) {
        for (int j = 0; j < t.size(); ++j) {
          const int64_t entered_j = times[j][0].item<int64_t>();
          const int64_t left_i = times[i][1].item<int64_t>();
          check_.require(left_i >= entered_j, c,
                         fmt::format("rank {} left the barrier {} us before rank {} entered it", t.ranks[i],
                                     (entered_j - left_i) / 1000, t.ranks[j]));
        }
      }
    }
  }

  // Strided and transposed views: results land in the view, the memory between is untouched.
  void nonContiguous(const Team& t) {
    for (auto dt : o_.dtypes) {
      for (int64_t n : o_.sizes) {
        const int64_t rows = n >= kBigSize ? 1001 : 3;
        const int64_t cols = n >= kBigSize ? 999 : n;
        const int64_t cells = rows * cols;
        for (ReduceOp op : o_.reduce_ops) {
          {
            const Mode m = next();
            Case c{"all_reduce", opName(op), dt, n, detail(t, "view=strided")};
            Tensor base = sentinel(dt, 2 * n);
            Tensor view = base.slice(0, 0, 2 * n, 2);
            Tensor gaps = base.slice(0, 1, 2 * n, 2).clone();
            view.copy_(reduceValues(op, dt, t.global(), n, m.salt).to(g_device, dt));
            check_.settle(dist::all_reduce(view, op, t.group, m.async_op), m.async_op, m.poll, c);
            check_.expect(view, expectedReduce(op, dt, t.ranks, n, m.salt), c, "reduced",
                          op == ReduceOp::AVG ? avgTolerance(dt) : 0);
            check_.expect(base.slice(0, 1, 2 * n, 2), gaps, c, "memory between the strided elements changed");
          }
          {
            const Mode m = next();
            Case c{"all_reduce", opName(op), dt, cells, detail(t, fmt::format("view=transposed({}x{})", rows, cols))};
            Tensor base = at::empty({cols, rows}, at::TensorOptions().dtype(dt).device(g_device));
            Tensor view = base.t();
            view.copy_(reduceValues(op, dt, t.global(), cells, m.salt).to(g_device, dt).view({rows, cols}));
            check_.settle(dist::all_reduce(view, op, t.group, m.async_op), m.async_op, m.poll, c);
            check_.expect(view, expectedReduce(op, dt, t.ranks, cells, m.salt), c, "reduced",
                          op == ReduceOp::AVG ? avgTolerance(dt) : 0);
          }
        }
        for (int root : {t.ranks.front(), t.ranks.back()}) {
          const Mode m = next();
          Case c{"broadcast", "-", dt, n, detail(t, fmt::format("src={} view=strided", root))};
          Tensor base = sentinel(dt, 2 * n);
          Tensor view = base.slice(0, 0, 2 * n, 2);
          Tensor gaps = base.slice(0, 1, 2 * n, 2).clone();
          if (t.global() == root) view.copy_(data(dt, root, n, m.salt));
          check_.settle(dist::broadcast(view, root, t.group, m.async_op), m.async_op, m.poll, c);
          check_.expect(view, dataValues(dt, root, n, m.salt), c, "broadcast data");
          check_.expect(base.slice(0, 1, 2 * n, 2), gaps, c, "memory between the strided elements changed");

          Case ct{"broadcast", "-", dt, cells,
                  detail(t, fmt::format("src={} view=transposed({}x{})", root, rows, cols))};
          Tensor tbase = sentinel(dt, cells).view({cols, rows});
          Tensor tview = tbase.t();
          if (t.global() == root) tview.copy_(data(dt, root, cells, m.salt).view({rows, cols}));
          check_.settle(dist::broadcast(tview, root, t.group, m.async_op), m.async_op, m.poll, ct);
          check_.expect(tview, dataValues(dt, root, cells, m.salt), ct, "broadcast data");
        }
        if (t.size() >= 2) {
          // Point to point from a transposed view into a strided one.
          const Mode m = next();
          const int left = t.left();
          const int right = t.right();
          Case c{"isend_irecv", "-", dt, cells, detail(t, fmt::format("from={} view=transposed->strided", left))};
          Tensor sbase = at::empty({cols, rows}, at::TensorOptions().dtype(dt).device(g_device));
          Tensor sview = sbase.t();
          sview.copy_(data(dt, t.global(), cells, m.salt).view({rows, cols}));
          Tensor rbase = sentinel(dt, 2 * cells);
          Tensor rview = rbase.slice(0, 0, 2 * cells, 2);
          Tensor gaps = rbase.slice(0, 1, 2 * cells, 2).clone();
          const int tag = static_cast<int>(m.serial % 1000) + 7;
          // On NCCL (one stream, issue order) the team's first rank sends first, as above.
          const bool send_first = g_stream_semantics && t.me == 0;
          dist::WorkPtr s = send_first ? dist::isend(sview, right, t.group, tag) : nullptr;
          auto r = dist::irecv(rview, left, t.group, tag);
          if (!send_first) s = dist::isend(sview, right, t.group, tag);
          check_.settle(s, true, m.poll, c);
          check_.settle(r, true, m.poll, c);
          check_.expect(rview, dataValues(dt, left, cells, m.salt), c, "received data");
          check_.expect(rbase.slice(0, 1, 2 * cells, 2), gaps, c, "memory between the strided elements changed");
        }
      }
    }
  }

  // Several async collectives in flight at once, waited in reverse order, then a blocking
  // one behind them: they must run in issue order and each complete on its own.
  void asyncQueue(const Team& t) {
    for (auto dt : o_.dtypes) {
      for (int64_t n : o_.sizes) {
        const Mode m = next();
        Case c{"async", "-", dt, n, detail(t)};
        const int root = t.ranks.back();
        Tensor sum = reduceValues(ReduceOp::SUM, dt, t.global(), n, m.salt).to(g_device, dt);
        Tensor bcast = t.global() == root ? data(dt, root, n, m.salt) : sentinel(dt, n);
        Tensor max = reduceValues(ReduceOp::MAX, dt, t.global(), n, m.salt + 1).to(g_device, dt);
        std::vector<Tensor> gathered;
        for (int i = 0; i < t.size(); ++i) gathered.push_back(sentinel(dt, n));
        Tensor in = data(dt, t.global(), n, m.salt + 2);
        std::vector<dist::WorkPtr> works = {
            dist::all_reduce(sum, ReduceOp::SUM, t.group, true), dist::broadcast(bcast, root, t.group, true),
            dist::all_reduce(max, ReduceOp::MAX, t.group, true), dist::all_gather(gathered, in, t.group, true)};
        Tensor after = reduceValues(ReduceOp::MIN, dt, t.global(), n, m.salt + 3).to(g_device, dt);
        dist::all_reduce(after, ReduceOp::MIN, t.group);
        for (auto it = works.rbegin(); it != works.rend(); ++it) {
          check_.require(*it && (g_stream_semantics || (*it)->isCompleted()), c,
                         "an async collective issued before a blocking one is "
                         "not complete after the blocking one returned");
          check_.settle(*it, true, m.poll, c);
        }
        Case cs = c;
        cs.reduce = "SUM";
        check_.expect(sum, expectedReduce(ReduceOp::SUM, dt, t.ranks, n, m.salt), cs, "async all_reduce");
        check_.expect(bcast, dataValues(dt, root, n, m.salt), c, "async broadcast");
        Case cm = c;
        cm.reduce = "MAX";
        check_.expect(max, expectedReduce(ReduceOp::MAX, dt, t.ranks, n, m.salt + 1), cm, "async all_reduce");
        for (int i = 0; i < t.size(); ++i) {
          check_.expect(gathered[i], dataValues(dt, t.ranks[i], n, m.salt + 2), c, "async all_gather");
        }
        Case cn = c;
        cn.reduce = "MIN";
        check_.expect(after, expectedReduce(ReduceOp::MIN, dt, t.ranks, n, m.salt + 3), cn,
                      "blocking all_reduce after async ones");
        // One tensor through an async SUM, then a blocking MAX: a blocking call on a contiguous
        // CPU tensor works in the caller's memory, so it must find the SUM's result there (MAX
        // first, then SUM, gives another value). Below the big sizes only: the order does not
        // depend on the size, and eight ranks on two cores take minutes per million elements.
        if (n < kBigSize) {
          Tensor dep = reduceValues(ReduceOp::SUM, dt, t.global(), n, m.salt + 4).to(g_device, dt);
          auto dep_work = dist::all_reduce(dep, ReduceOp::SUM, t.group, true);
          dist::all_reduce(dep, ReduceOp::MAX, t.group);
          check_.settle(dep_work, true, m.poll, c);
          check_.expect(dep, expectedReduce(ReduceOp::SUM, dt, t.ranks, n, m.salt + 4), cs,
                        "blocking MAX after an async SUM of the same tensor");
          stagedOrder(t, dt, n, m, cs);
        }
      }
    }
  }

  // The same order through the staged path: a strided tensor is worked on through a
  // contiguous copy (a CUDA one through a host copy), and each op queued behind an async SUM
  // of that tensor must copy in what the SUM wrote back, whichever op it is. Every op after
  // the SUM gives the SUM again (MAX of equal values), so a copy made before it shows.
  void stagedOrder(const Team& t, at::ScalarType dt, int64_t n, const Mode& m, const Case& cs) {
    const int root = t.ranks.front();
    const Tensor summed = expectedReduce(ReduceOp::SUM, dt, t.ranks, n, m.salt + 5);
    auto summing = [&] {
      Tensor view = sentinel(dt, 2 * n).slice(0, 0, 2 * n, 2);
      view.copy_(reduceValues(ReduceOp::SUM, dt, t.global(), n, m.salt + 5).to(g_device, dt));
      dist::WorkPtr work = dist::all_reduce(view, ReduceOp::SUM, t.group, true);
      return std::make_pair(view, work);
    };
    auto label = [&](const std::string& op) {
      Case c = cs;
      c.detail += " view=strided then=" + op;
      return c;
    };
    {
      auto [x, sum] = summing();
      dist::all_reduce(x, ReduceOp::MAX, t.group);
      check_.settle(sum, true, m.poll, label("all_reduce"));
      check_.expect(x, summed, label("all_reduce"), "strided: blocking MAX after an async SUM of the same tensor");
    }
    {
      auto [x, sum] = summing();
      dist::broadcast(x, root, t.group);
      check_.settle(sum, true, m.poll, label("broadcast"));
      check_.expect(x, summed, label("broadcast"), "strided: broadcast after an async SUM of the same tensor");
    }
    {
      auto [x, sum] = summing();
      dist::reduce(x, root, ReduceOp::MAX, t.group);
      check_.settle(sum, true, m.poll, label("reduce"));
      if (t.global() == root) {
        check_.expect(x, summed, label("reduce"), "strided: reduce MAX after an async SUM of the same tensor");
      }
    }
    {
      auto [x, sum] = summing();
      std::vector<Tensor> gathered;
      for (int i = 0; i < t.size(); ++i) gathered.push_back(sentinel(dt, n));
      dist::all_gather(gathered, x, t.group);
      check_.settle(sum, true, m.poll, label("all_gather"));
      for (int i = 0; i < t.size(); ++i) {
        check_.expect(gathered[i], summed, label("all_gather"), "strided: all_gather after an async SUM of its input");
      }
    }
    {
      auto [x, sum] = summing();
      std::vector<Tensor> gathered;
      if (t.global() == root) {
        for (int i = 0; i < t.size(); ++i) gathered.push_back(sentinel(dt, n));
      }
      dist::gather(x, t.global() == root ? &gathered : nullptr, root, t.group);
      check_.settle(sum, true, m.poll, label("gather"));
      for (const Tensor& g : gathered) {
        check_.expect(g, summed, label("gather"), "strided: gather after an async SUM of its input");
      }
    }
    {
      // Every input of the reduce_scatter and the scatter is the summed tensor.
      std::vector<Tensor> xs;
      std::vector<dist::WorkPtr> sums;
      for (int i = 0; i < t.size(); ++i) {
        auto [x, sum] = summing();
        xs.push_back(x);
        sums.push_back(sum);
      }
      Tensor out = sentinel(dt, n);
      dist::reduce_scatter(out, xs, ReduceOp::MAX, t.group);
      Tensor scattered = sentinel(dt, n);
      dist::scatter(scattered, t.global() == root ? &xs : nullptr, root, t.group);
      for (auto& sum : sums) check_.settle(sum, true, m.poll, label("reduce_scatter"));
      check_.expect(out, summed, label("reduce_scatter"), "strided: reduce_scatter MAX after async SUMs of its inputs");
      check_.expect(scattered, summed, label("scatter"), "strided: scatter after async SUMs of its inputs");
    }
  }

  const Options& o_;
  Checker& check_;
  int64_t combo_ = 0;
};

void initGroup(const Options& o) {
  dist::InitOptions init;
  init.init_method = o.init;
  init.rank = o.rank;
  init.world_size = o.world_size;
  init.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  init.backend = o.backend;
  if (o.device != "cpu") {
    // One device per process, as torch's examples do: LOCAL_RANK modulo the visible devices,
    // made current (torch.cuda.set_device) so that a barrier before any op finds it.
    const int devices = static_cast<int>(at::getNumGPUs());
    if (devices == 0) throw UsageError("--device " + o.device + ": no CUDA device is visible");
    g_cuda_device = at::Device(at::kCUDA, static_cast<at::DeviceIndex>(ddprun::runtime::localDeviceIndex(devices)));
    c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(g_cuda_device);
    g_device = g_cuda_device;
  }
  dist::init_process_group(init);
  const std::string backend = dist::get_backend();
  g_stream_semantics = o.device != "cpu" && (backend == "nccl" || backend.find("cuda:nccl") != std::string::npos);
  // A first collective before new_group: where it runs on NCCL (backend nccl) the default
  // group's communicator exists, so new_group splits it (ncclCommSplit) instead of making one.
  if (o.device != "cpu") dist::barrier();
}

// All ranks make every group, in the same order; a rank outside a group skips it.
std::vector<Team> makeTeams(const Options& o, int rank, int world) {
  std::vector<Team> teams;
  for (const auto& name : o.teams) {
    std::vector<int> ranks;
    for (int r = 0; r < world; ++r) {
      if (name == "world" || name == "reversed" || (name == "even" && r % 2 == 0) || (name == "odd" && r % 2 == 1)) {
        ranks.push_back(r);
      }
    }
    if (name == "reversed") std::reverse(ranks.begin(), ranks.end());
    if (ranks.empty()) continue;
    Team t{name, nullptr, ranks, 0};
    if (name != "world") t.group = dist::new_group(ranks, {}, o.group_backend);
    auto it = std::find(ranks.begin(), ranks.end(), rank);
    if (it == ranks.end()) continue;
    t.me = static_cast<int>(it - ranks.begin());
    if (name != "world" && !t.group)
      throw Mismatch(fmt::format("MISMATCH new_group({}): no group on member rank {}", name, rank));
    if (dist::get_rank(t.group) != t.me || dist::get_world_size(t.group) != t.size()) {
      throw Mismatch(fmt::format("MISMATCH team {} rank {}: get_rank {} (expected {}), get_world_size {} (expected {})",
                                 name, rank, dist::get_rank(t.group), t.me, dist::get_world_size(t.group), t.size()));
    }
    teams.push_back(std::move(t));
  }
  return teams;
}

// The labels of the operations in this rank's ring of the default group, counted in order of
// first appearance: "flight rank R: all_reduce int64 x3, ... pending=K" for the collectives,
// "flight p2p rank R: send int64 n=7 peer=1 x2, ... pending=K" for the messages.
void printFlightSummary(int rank, ddprun::FlightRingKind kind) {
  const char* dir = std::getenv("DDPRUN_FLIGHT_DIR");
  if (!dir) throw UsageError("--flight-summary needs DDPRUN_FLIGHT_DIR (run under ddprun)");
  std::string error;
  auto ring = ddprun::readFlightRingFile(std::string(dir) + "/" + ddprun::flightRingFileName(rank, 0, kind), &error);
  if (!ring) throw std::runtime_error(error);
  if (ring->kind != kind) throw std::runtime_error("the ring's flags say it is of the other kind");
  const bool messages = kind == ddprun::FlightRingKind::kPointToPoint;
  std::vector<std::pair<std::string, int>> counts;
  int pending = 0;
  for (const auto& r : ring->records) {
    std::string label = fmt::format("{} {}", ddprun::flightOpName(r.info.op), ddprun::flightDTypeName(r.info.dtype));
    if (messages) label += fmt::format(" n={} peer={}", r.info.count, r.info.root);
    auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == label; });
    if (it == counts.end()) {
      counts.emplace_back(label, 1);
    } else {
      ++it->second;
    }
    if (r.state != ddprun::FlightState::kCompleted) ++pending;
  }
  std::string line = fmt::format("flight {}rank {}:", messages ? "p2p " : "", rank);
  for (const auto& [label, n] : counts) line += fmt::format(" {} x{},", label, n);
  std::printf("%s pending=%d\n", line.c_str(), pending);
  std::fflush(stdout);
}

int runMatrix(const Options& o) {
  const auto start = std::chrono::steady_clock::now();
  initGroup(o);
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();
  if (o.verbose) {
    std::printf("rank %d: backend %s (default device %s), tensors on %s\n", rank, dist::get_backend().c_str(),
                dist::get_default_device().str().c_str(), g_device.str().c_str());
  }
  Checker check(o, rank);
  for (const auto& team : makeTeams(o, rank, world)) {
    Suite suite(o, check);  // salts and tags count from 0 in each team, on each member alike
    for (size_t k = 0; k < o.ops.size(); ++k) {
      const std::string& op = o.ops[k];
      // --device both: CPU and CUDA tensors in turns, through one group's two backends.
      if (o.device == "both") g_device = k % 2 ? g_cuda_device : at::Device(at::kCPU);
      const auto op_start = std::chrono::steady_clock::now();
      const double local_before = g_local_seconds;
      suite.run(team, op);
      if (o.verbose && team.me == 0) {
        std::printf("rank %d team %s op %s: %.2f s (%.2f s computing inputs and expected results)\n", rank,
                    team.name.c_str(), op.c_str(),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - op_start).count(),
                    g_local_seconds - local_before);
        std::fflush(stdout);
      }
    }
  }
  dist::barrier();
  if (o.flight_summary) {
    printFlightSummary(rank, ddprun::FlightRingKind::kCollective);
    printFlightSummary(rank, ddprun::FlightRingKind::kPointToPoint);
  }
  dist::destroy_process_group();
  std::printf("rank %d of %d: collectives ok, %lld checks in %.2f s\n", rank, world,
              static_cast<long long>(check.checks()),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}

// One rank dies abruptly in the middle of a loop of large all_reduce (or all_gather) calls;
// every other rank must see a PeerError (exit 3), never hang.
int runKilledPeer(const Options& o) {
  initGroup(o);
  const int rank = dist::get_rank();
  if (o.victim < 0 || o.victim >= dist::get_world_size()) throw UsageError("--victim must be a rank");
  Tensor x = at::ones({o.big_count}, at::TensorOptions().dtype(at::kFloat).device(g_device));
  dist::barrier();
  if (rank == o.victim) {
    std::thread([ms = o.die_after_ms, rank] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      std::fprintf(stderr, "rank %d: dying now (SIGKILL)\n", rank);
      ::raise(SIGKILL);
    }).detach();
  }
  const auto start = std::chrono::steady_clock::now();
  const auto limit = std::chrono::duration<double>(3 * o.timeout_s + 30);
  int64_t iterations = 0;
  std::vector<Tensor> gathered;
  for (int q = 0; q < dist::get_world_size() && o.kill_op == "all_gather"; ++q) gathered.push_back(at::empty_like(x));
  while (std::chrono::steady_clock::now() - start < limit) {
    if (o.kill_op == "all_gather") {
      dist::all_gather(gathered, x);
    } else {
      dist::all_reduce(x);
      x.fill_(1);
    }
    ++iterations;
  }
  std::printf("rank %d: no peer error after %lld %s calls\n", rank, static_cast<long long>(iterations),
              o.kill_op.c_str());
  return 4;
}

int runWorker(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "usage: %s\n", e.what());
    return 2;
  }
  try {
    return o.die_after_ms >= 0 ? runKilledPeer(o) : runMatrix(o);
  } catch (const Mismatch& e) {
    std::fprintf(stderr, "%s\n", e.what());
    ddprun::runtime::writeErrorFile(e.what(), "collectives_worker: result check");
    return 1;
  } catch (const dist::PeerError& e) {
    std::fprintf(stderr, "peer error: %s\n", e.what());
    std::fflush(stderr);
    ddprun::runtime::writeErrorFile(std::string("peer error: ") + e.what(), "collectives_worker");
    // A survivor that stays up (connections open) must not spare the others their own error.
    std::this_thread::sleep_for(std::chrono::milliseconds(o.linger_ms));
    return 3;
  }
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::runtime::recordErrors([&] { return runWorker(argc, argv); });
}
