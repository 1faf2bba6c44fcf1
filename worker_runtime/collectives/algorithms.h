// The collective algorithms of the host backend, over any Links (the TCP mesh or the
// shared-memory rings), which they never tell apart: which links they run on, and whether a
// collective runs an algorithm at all, is the backend's choice (backend/host_collectives.h).
// Every rank of the group must call the same collective with matching
// arguments, in the same order; each call blocks until this rank's part is done or
// `deadline` passes. Buffers are raw bytes; element type and operator come from dtype.h.
// Thread-safety: the functions keep no state; a Links object is driven by one thread at a
// time, so two collectives on one group must not run at once (the backend serialises them).
//   all_reduce: recursive doubling for small messages (latency), a ring of reduce-scatter
//     then all-gather for large ones (bandwidth), the reduction following the data in;
//   broadcast / reduce: binomial trees; all_gather / reduce_scatter: rings;
//   gather / scatter / all_to_all (even or uneven): direct transfers, all in flight at once;
//   barrier: dissemination.
// The sizes that choose between algorithms are CollectiveOptions, so tests reach every
// algorithm with small buffers (as gloo's tests do with maxSegmentSize).
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "worker_runtime/collectives/dtype.h"
#include "worker_runtime/transport/links.h"

namespace ddprun::runtime {

// Every rank of a group must use the same values (they choose the algorithm each rank runs).
struct CollectiveOptions {
  // all_reduce messages up to this many bytes take recursive doubling (latency-optimal),
  // larger ones the ring (bandwidth-optimal). Default 64 KiB.
  size_t small_all_reduce_bytes = 64 * 1024;
  // The ring's reduction follows the data in, in steps of this many received bytes (need not
  // be a multiple of the element size; 0 reduces what each receive brought). Default 256 KiB.
  size_t reduce_step_bytes = 256 * 1024;
};

// What an algorithm runs with. Which links these are (and whether a collective runs an
// algorithm at all) is the backend's choice (backend/host_collectives.h).
struct AlgorithmContext {
  Links& links;
  Clock::time_point deadline;
  std::vector<uint8_t>& scratch;  // reused between calls; grows as needed
  CollectiveOptions options = {};
};

// The blocks of a flat buffer of `p` blocks of `bytes` each (T: void or const void).
template <typename T>
std::vector<T*> blocksOf(T* flat, int p, size_t bytes) {
  using Byte = std::conditional_t<std::is_const_v<T>, const uint8_t, uint8_t>;
  std::vector<T*> blocks(p);
  for (int q = 0; q < p; ++q) blocks[q] = static_cast<Byte*>(flat) + q * bytes;
  return blocks;
}

void allReduce(AlgorithmContext ctx, void* buf, size_t count, DType dtype, ReduceOp op);
void broadcast(AlgorithmContext ctx, void* buf, size_t bytes, int root);
// The result lands in `buf` on `root`; other ranks' buffers are left unchanged.
void reduce(AlgorithmContext ctx, void* buf, size_t count, DType dtype, ReduceOp op, int root);
// `out` holds size() blocks of `bytes_per_rank`, in rank order.
void allGather(AlgorithmContext ctx, const void* in, void* out, size_t bytes_per_rank);
// The same into blocks anywhere: outs[q] (size() of them) gets rank q's block. (Not an
// overload: any T** would silently convert to the flat form's void*.)
void allGatherInto(AlgorithmContext ctx, const void* in, void* const* outs, size_t bytes_per_rank);
// `out` is used on root only (size() blocks).
void gather(AlgorithmContext ctx, const void* in, void* out, size_t bytes_per_rank, int root);
// `in` is used on root only (size() blocks).
void scatter(AlgorithmContext ctx, const void* in, void* out, size_t bytes_per_rank, int root);
// `in` holds size() blocks of `count_per_rank` elements; block r, reduced, lands in `out`.
void reduceScatter(AlgorithmContext ctx, const void* in, void* out, size_t count_per_rank, DType dtype, ReduceOp op);
// The same from blocks anywhere: ins[q] (size() of them) is block q.
void reduceScatterFrom(AlgorithmContext ctx, const void* const* ins, void* out, size_t count_per_rank, DType dtype,
                       ReduceOp op);
// Block j of `in` goes to rank j; block j of `out` comes from rank j.
void allToAll(AlgorithmContext ctx, const void* in, void* out, size_t bytes_per_rank);
// Uneven all_to_all: in[j] goes to rank j, out[j] comes from rank j; both hold size()
// blocks. out[j] must be exactly as long as rank j's in[rank()]: the transports cannot
// tell a mismatch (the streams fall out of step). in[rank()] is copied to out[rank()]; a
// different length there throws DdprunError, as does a list that is not size() long.
void allToAllV(AlgorithmContext ctx, std::span<const std::span<const uint8_t>> in,
               std::span<const std::span<uint8_t>> out);
void barrier(AlgorithmContext ctx);

}  // namespace ddprun::runtime
