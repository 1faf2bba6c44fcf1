// The collective algorithms of the host backend, over any Links (TCP mesh today).
// Every rank of the group must call the same collective with matching arguments, in the
// same order; each call blocks until this rank's part is done or `deadline` passes.
// Buffers are raw bytes; element type and operator come from dtype.h.
// Thread-safety: the functions keep no state; a Links object is driven by one thread at a
// time, so two collectives on one group must not run at once (the backend serialises them).
//   all_reduce: recursive doubling for small messages (latency), a ring of reduce-scatter
//     then all-gather for large ones (bandwidth), the reduction following the data in;
//   broadcast / reduce: binomial trees; all_gather / reduce_scatter: rings;
//   gather / scatter / all_to_all: direct transfers, all in flight at once;
//   barrier: dissemination.
#pragma once

#include <cstdint>
#include <vector>

#include "worker_runtime/collectives/dtype.h"
#include "worker_runtime/transport/links.h"

namespace ddprun::runtime {

class ShmAllReduce;

struct CollectiveContext {
  Links& links;
  Clock::time_point deadline;
  std::vector<uint8_t>& scratch;  // reused between calls; grows as needed
  ShmAllReduce* shm = nullptr;    // set when every rank is on this host: all_reduce goes through it
};

// Messages up to this size take the latency-optimal all_reduce.
inline constexpr size_t kSmallAllReduceBytes = 64 * 1024;

void allReduce(CollectiveContext ctx, void* buf, size_t count, DType dtype, ReduceOp op);
void broadcast(CollectiveContext ctx, void* buf, size_t bytes, int root);
// The result lands in `buf` on `root`; other ranks' buffers are left unchanged.
void reduce(CollectiveContext ctx, void* buf, size_t count, DType dtype, ReduceOp op, int root);
// `out` holds size() blocks of `bytes_per_rank`, in rank order.
void allGather(CollectiveContext ctx, const void* in, void* out, size_t bytes_per_rank);
// `out` is used on root only (size() blocks).
void gather(CollectiveContext ctx, const void* in, void* out, size_t bytes_per_rank, int root);
// `in` is used on root only (size() blocks).
void scatter(CollectiveContext ctx, const void* in, void* out, size_t bytes_per_rank, int root);
// `in` holds size() blocks of `count_per_rank` elements; block r, reduced, lands in `out`.
void reduceScatter(CollectiveContext ctx, const void* in, void* out, size_t count_per_rank, DType dtype,
                   ReduceOp op);
// Block j of `in` goes to rank j; block j of `out` comes from rank j.
void allToAll(CollectiveContext ctx, const void* in, void* out, size_t bytes_per_rank);
void barrier(CollectiveContext ctx);

}  // namespace ddprun::runtime
