#include "worker_runtime/collectives/algorithms.h"

#include <cstring>
#include <type_traits>

#include <fmt/format.h>

#include "common/error.h"

namespace ddprun::runtime {
namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

uint8_t* scratchOf(AlgorithmContext& ctx, size_t bytes) {
  if (ctx.scratch.size() < bytes) ctx.scratch.resize(bytes);
  return ctx.scratch.data();
}

// Receives `bytes` from `src` into `tmp` while sending `send_bytes` of `send` to `dst`;
// each completed span of received elements is reduced into `acc` as it arrives.
void sendRecvReduce(AlgorithmContext& ctx, int dst, const void* send, size_t send_bytes, int src, uint8_t* tmp,
                    uint8_t* acc, size_t count, DType dtype, ReduceOp op, const char* what) {
  const size_t esize = dtypeSize(dtype);
  size_t reduced = 0;
  Transfer transfers[2];
  transfers[0] = Transfer{dst, true, const_cast<void*>(send), send_bytes, {}, 0, 0};
  transfers[1] = Transfer{src,
                          false,
                          tmp,
                          count * esize,
                          [&](size_t received) {
                            size_t ready = received / esize;
                            if (ready > reduced) {
                              reduceInto(acc + reduced * esize, tmp + reduced * esize, ready - reduced, dtype, op);
                              reduced = ready;
                            }
                          },
                          ctx.options.reduce_step_bytes,
                          0};
  ctx.links.exchange(transfers, ctx.deadline, what);
}

void sendRecv(AlgorithmContext& ctx, int dst, const void* send, size_t send_bytes, int src, void* recv,
              size_t recv_bytes, const char* what) {
  Transfer transfers[2];
  transfers[0] = Transfer{dst, true, const_cast<void*>(send), send_bytes, {}, 0, 0};
  transfers[1] = Transfer{src, false, recv, recv_bytes, {}, 0, 0};
  ctx.links.exchange(transfers, ctx.deadline, what);
}

void sendTo(AlgorithmContext& ctx, int dst, const void* data, size_t bytes, const char* what) {
  Transfer t{dst, true, const_cast<void*>(data), bytes, {}, 0, 0};
  ctx.links.exchange({&t, 1}, ctx.deadline, what);
}

void recvFrom(AlgorithmContext& ctx, int src, void* data, size_t bytes, const char* what) {
  Transfer t{src, false, data, bytes, {}, 0, 0};
  ctx.links.exchange({&t, 1}, ctx.deadline, what);
}

// Segment i of a ring over `count` elements: [begin(i), begin(i+1)); sizes differ by at
// most one element, and may be zero when count < size.
size_t segmentBegin(size_t count, int segments, int i) {
  // floor(count * i / segments) without overflowing: the remainder term is < segments^2.
  const size_t p = static_cast<size_t>(segments), k = static_cast<size_t>(i);
  return count / p * k + count % p * k / p;
}

// After size-1 steps, this rank holds the full reduction of segment rank() of `acc`.
void ringReduceScatter(AlgorithmContext& ctx, uint8_t* acc, const size_t* begins, DType dtype, ReduceOp op,
                       const char* what) {
  const int p = ctx.links.size(), r = ctx.links.rank();
  const size_t esize = dtypeSize(dtype);
  size_t max_segment = 0;
  for (int i = 0; i < p; ++i) max_segment = std::max(max_segment, begins[i + 1] - begins[i]);
  uint8_t* tmp = scratchOf(ctx, max_segment * esize);
  for (int s = 0; s < p - 1; ++s) {
    const int send_seg = mod(r - s - 1, p), recv_seg = mod(r - s - 2, p);
    const size_t recv_count = begins[recv_seg + 1] - begins[recv_seg];
    sendRecvReduce(ctx, mod(r + 1, p), acc + begins[send_seg] * esize,
                   (begins[send_seg + 1] - begins[send_seg]) * esize, mod(r - 1, p), tmp,
                   acc + begins[recv_seg] * esize, recv_count, dtype, op, what);
  }
}

void ringAllGatherSegments(AlgorithmContext& ctx, uint8_t* buf, const size_t* begins, size_t esize, const char* what) {
  const int p = ctx.links.size(), r = ctx.links.rank();
  for (int s = 0; s < p - 1; ++s) {
    const int send_seg = mod(r - s, p), recv_seg = mod(r - s - 1, p);
    sendRecv(ctx, mod(r + 1, p), buf + begins[send_seg] * esize, (begins[send_seg + 1] - begins[send_seg]) * esize,
             mod(r - 1, p), buf + begins[recv_seg] * esize, (begins[recv_seg + 1] - begins[recv_seg]) * esize, what);
  }
}

void ringAllReduce(AlgorithmContext& ctx, uint8_t* buf, size_t count, DType dtype, ReduceOp op) {
  const int p = ctx.links.size();
  std::vector<size_t> begins(p + 1);
  for (int i = 0; i <= p; ++i) begins[i] = segmentBegin(count, p, i);
  ringReduceScatter(ctx, buf, begins.data(), dtype, op, "all_reduce");
  ringAllGatherSegments(ctx, buf, begins.data(), dtypeSize(dtype), "all_reduce");
}

// Recursive doubling; ranks beyond the largest power of two fold into a partner first.
void doublingAllReduce(AlgorithmContext& ctx, uint8_t* buf, size_t count, DType dtype, ReduceOp op) {
  const int p = ctx.links.size(), r = ctx.links.rank();
  const size_t bytes = count * dtypeSize(dtype);
  uint8_t* tmp = scratchOf(ctx, bytes);
  int pow2 = 1;
  while (pow2 * 2 <= p) pow2 *= 2;
  const int extra = p - pow2;
  int vrank;
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      sendTo(ctx, r + 1, buf, bytes, "all_reduce");
      recvFrom(ctx, r + 1, buf, bytes, "all_reduce");
      return;
    }
    recvFrom(ctx, r - 1, tmp, bytes, "all_reduce");
    reduceInto(buf, tmp, count, dtype, op);
    vrank = r / 2;
  } else {
    vrank = r - extra;
  }
  auto real = [&](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  for (int mask = 1; mask < pow2; mask <<= 1) {
    const int partner = real(vrank ^ mask);
    sendRecv(ctx, partner, buf, bytes, partner, tmp, bytes, "all_reduce");
    // Both partners combine in the same order, so every rank ends bitwise identical.
    if ((vrank & mask) == 0) {
      reduceInto(buf, tmp, count, dtype, op);
    } else {
      reduceInto(tmp, buf, count, dtype, op);
      std::memcpy(buf, tmp, bytes);
    }
  }
  if (r < 2 * extra) sendTo(ctx, r - 1, buf, bytes, "all_reduce");
}

}  // namespace

void allReduce(AlgorithmContext ctx, void* buf, size_t count, DType dtype, ReduceOp op) {
  const int p = ctx.links.size();
  if (p > 1 && count > 0) {
    auto* data = static_cast<uint8_t*>(buf);
    if (count * dtypeSize(dtype) <= ctx.options.small_all_reduce_bytes || count < static_cast<size_t>(p)) {
      doublingAllReduce(ctx, data, count, dtype, op);
    } else {
      ringAllReduce(ctx, data, count, dtype, op);
    }
  }
  if (op == ReduceOp::kAvg) divideBy(buf, count, dtype, p);
}

void broadcast(AlgorithmContext ctx, void* buf, size_t bytes, int root) {
  const int p = ctx.links.size();
  const int v = mod(ctx.links.rank() - root, p);
  int mask = 1;
  while (mask < p) {
    if (v & mask) {
      recvFrom(ctx, mod(v - mask + root, p), buf, bytes, "broadcast");
      break;
    }
    mask <<= 1;
  }
  // To every child at once: one slow child does not hold up the others' copies.
  std::vector<Transfer> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < p) sends.push_back(Transfer{mod(v + mask + root, p), true, buf, bytes, {}, 0, 0});
  }
  if (!sends.empty()) ctx.links.exchange(sends, ctx.deadline, "broadcast");
}

void reduce(AlgorithmContext ctx, void* buf, size_t count, DType dtype, ReduceOp op, int root) {
  const int p = ctx.links.size(), r = ctx.links.rank();
  const size_t bytes = count * dtypeSize(dtype);
  const int v = mod(r - root, p);
  // Non-roots accumulate in scratch, so their own buffers stay as they were.
  uint8_t* area = scratchOf(ctx, 2 * bytes);
  uint8_t* acc = r == root ? static_cast<uint8_t*>(buf) : area;
  uint8_t* tmp = area + bytes;
  // An empty buffer may be null, and so is the unused scratch: memcpy must not see them.
  if (r != root && bytes > 0) std::memcpy(acc, buf, bytes);
  for (int mask = 1; mask < p; mask <<= 1) {
    if (v & mask) {
      sendTo(ctx, mod(v - mask + root, p), acc, bytes, "reduce");
      break;
    }
    if (v + mask < p) {
      recvFrom(ctx, mod(v + mask + root, p), tmp, bytes, "reduce");
      reduceInto(acc, tmp, count, dtype, op);
    }
  }
  if (r == root && op == ReduceOp::kAvg) divideBy(buf, count, dtype, p);
}

void allGather(AlgorithmContext ctx, const void* in, void* out, size_t bytes_per_rank) {
  allGatherInto(ctx, in, blocksOf<void>(out, ctx.links.size(), bytes_per_rank).data(), bytes_per_rank);
}

void allGatherInto(AlgorithmContext ctx, const void* in, void* const* outs, size_t bytes_per_rank) {
  const int p = ctx.links.size(), r = ctx.links.rank();
  if (bytes_per_rank > 0 && in != outs[r]) std::memcpy(outs[r], in, bytes_per_rank);
  // This rank starts by sending its own block; after p-1 steps it has every block.
  for (int s = 0; s < p - 1; ++s) {
    const int send_block = mod(r - s, p), recv_block = mod(r - s - 1, p);
    sendRecv(ctx, mod(r + 1, p), outs[send_block], bytes_per_rank, mod(r - 1, p), outs[recv_block], bytes_per_rank,
             "all_gather");
  }
}

void gather(AlgorithmContext ctx, const void* in, void* out, size_t bytes_per_rank, int root) {
  const int p = ctx.links.size(), r = ctx.links.rank();
  if (r != root) {
    sendTo(ctx, root, in, bytes_per_rank, "gather");
    return;
  }
  auto* o = static_cast<uint8_t*>(out);
  std::vector<Transfer> transfers;
  for (int peer = 0; peer < p; ++peer) {
    if (peer == r) continue;
    transfers.push_back(Transfer{peer, false, o + peer * bytes_per_rank, bytes_per_rank, {}, 0, 0});
  }
  if (bytes_per_rank > 0) std::memcpy(o + r * bytes_per_rank, in, bytes_per_rank);
  ctx.links.exchange(transfers, ctx.deadline, "gather");
}

void scatter(AlgorithmContext ctx, const void* in, void* out, size_t bytes_per_rank, int root) {
  const int p = ctx.links.size(), r = ctx.links.rank();
  if (r != root) {
    recvFrom(ctx, root, out, bytes_per_rank, "scatter");
    return;
  }
  auto* i = static_cast<const uint8_t*>(in);
  std::vector<Transfer> transfers;
  for (int peer = 0; peer < p; ++peer) {
    if (peer == r) continue;
    transfers.push_back(
        Transfer{peer, true, const_cast<uint8_t*>(i + peer * bytes_per_rank), bytes_per_rank, {}, 0, 0});
  }
  if (bytes_per_rank > 0) std::memcpy(out, i + r * bytes_per_rank, bytes_per_rank);
  ctx.links.exchange(transfers, ctx.deadline, "scatter");
}

void reduceScatter(AlgorithmContext ctx, const void* in, void* out, size_t count_per_rank, DType dtype, ReduceOp op) {
  reduceScatterFrom(ctx, blocksOf<const void>(in, ctx.links.size(), count_per_rank * dtypeSize(dtype)).data(), out,
                    count_per_rank, dtype, op);
}

void reduceScatterFrom(AlgorithmContext ctx, const void* const* ins, void* out, size_t count_per_rank, DType dtype,
                       ReduceOp op) {
  const int p = ctx.links.size(), r = ctx.links.rank();
  const size_t block = count_per_rank * dtypeSize(dtype);
  // The ring reduces in place: it works on a copy so the caller's input stays intact.
  std::vector<uint8_t> acc(block * p);
  for (int q = 0; q < p && block > 0; ++q) std::memcpy(acc.data() + q * block, ins[q], block);
  std::vector<size_t> begins(p + 1);
  for (int i = 0; i <= p; ++i) begins[i] = i * count_per_rank;
  if (p > 1 && count_per_rank > 0) ringReduceScatter(ctx, acc.data(), begins.data(), dtype, op, "reduce_scatter");
  if (block > 0) std::memcpy(out, acc.data() + r * block, block);
  if (op == ReduceOp::kAvg) divideBy(out, count_per_rank, dtype, p);
}

void allToAll(AlgorithmContext ctx, const void* in, void* out, size_t bytes_per_rank) {
  const int p = ctx.links.size(), r = ctx.links.rank();
  auto* i = static_cast<const uint8_t*>(in);
  auto* o = static_cast<uint8_t*>(out);
  std::vector<Transfer> transfers;
  for (int peer = 0; peer < p; ++peer) {
    if (peer == r) continue;
    transfers.push_back(
        Transfer{peer, true, const_cast<uint8_t*>(i + peer * bytes_per_rank), bytes_per_rank, {}, 0, 0});
    transfers.push_back(Transfer{peer, false, o + peer * bytes_per_rank, bytes_per_rank, {}, 0, 0});
  }
  if (bytes_per_rank > 0) std::memmove(o + r * bytes_per_rank, i + r * bytes_per_rank, bytes_per_rank);
  ctx.links.exchange(transfers, ctx.deadline, "all_to_all");
}

void allToAllV(AlgorithmContext ctx, std::span<const std::span<const uint8_t>> in,
               std::span<const std::span<uint8_t>> out) {
  const int p = ctx.links.size(), r = ctx.links.rank();
  if (in.size() != static_cast<size_t>(p) || out.size() != static_cast<size_t>(p)) {
    throw DdprunError(
        fmt::format("all_to_all: {} input and {} output blocks in a group of {}", in.size(), out.size(), p));
  }
  if (in[r].size() != out[r].size()) {
    throw DdprunError(fmt::format("all_to_all: rank {}'s block to itself is {} bytes in and {} bytes out", r,
                                  in[r].size(), out[r].size()));
  }
  std::vector<Transfer> transfers;
  for (int peer = 0; peer < p; ++peer) {
    if (peer == r) continue;
    transfers.push_back(Transfer{peer, true, const_cast<uint8_t*>(in[peer].data()), in[peer].size(), {}, 0, 0});
    transfers.push_back(Transfer{peer, false, out[peer].data(), out[peer].size(), {}, 0, 0});
  }
  if (!in[r].empty()) std::memmove(out[r].data(), in[r].data(), in[r].size());
  ctx.links.exchange(transfers, ctx.deadline, "all_to_all");
}

void barrier(AlgorithmContext ctx) {
  const int p = ctx.links.size(), r = ctx.links.rank();
  uint8_t token = 1, got = 0;
  for (int k = 1; k < p; k <<= 1) {
    sendRecv(ctx, mod(r + k, p), &token, 1, mod(r - k, p), &got, 1, "barrier");
  }
}

}  // namespace ddprun::runtime
