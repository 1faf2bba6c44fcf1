// The host backend's collectives: each picks its transport. When every rank of the group is
// on this host, all_reduce, broadcast, all_gather, reduce_scatter and the barrier go through
// shared memory (collectives/shm_collectives.h); everything else, and everything on a group
// that spans hosts, runs the algorithms of collectives/algorithms.h over the group's links
// (the TCP mesh, or the shared-memory rings), which never know which transport they are on.
// The functions' contracts are the algorithms' (collectives/algorithms.h), with the same
// names; a CollectiveContext given to one of them picks these.
#pragma once

#include <cstdint>
#include <span>

#include "worker_runtime/collectives/algorithms.h"
#include "worker_runtime/collectives/shm_collectives.h"

namespace ddprun::runtime {

// What a collective of the host backend runs with: the algorithms' context (links,
// deadline, scratch, options) and, when every rank is on this host, the shared-memory
// collectives.
struct CollectiveContext : AlgorithmContext {
  ShmCollectives* shm = nullptr;
};

// Through shared memory when `shm` is set and the group has more than one rank (broadcast,
// all_gather and reduce_scatter: and the message is not empty).
void allReduce(CollectiveContext ctx, void* buf, size_t count, DType dtype, ReduceOp op);
void broadcast(CollectiveContext ctx, void* buf, size_t bytes, int root);
void allGather(CollectiveContext ctx, const void* in, void* out, size_t bytes_per_rank);
void allGatherInto(CollectiveContext ctx, const void* in, void* const* outs, size_t bytes_per_rank);
void reduceScatter(CollectiveContext ctx, const void* in, void* out, size_t count_per_rank, DType dtype, ReduceOp op);
void reduceScatterFrom(CollectiveContext ctx, const void* const* ins, void* out, size_t count_per_rank, DType dtype,
                       ReduceOp op);
void barrier(CollectiveContext ctx);

// Always the algorithms over the links.
void reduce(CollectiveContext ctx, void* buf, size_t count, DType dtype, ReduceOp op, int root);
void gather(CollectiveContext ctx, const void* in, void* out, size_t bytes_per_rank, int root);
void scatter(CollectiveContext ctx, const void* in, void* out, size_t bytes_per_rank, int root);
void allToAll(CollectiveContext ctx, const void* in, void* out, size_t bytes_per_rank);
void allToAllV(CollectiveContext ctx, std::span<const std::span<const uint8_t>> in,
               std::span<const std::span<uint8_t>> out);

}  // namespace ddprun::runtime
