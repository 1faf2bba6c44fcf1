#include "worker_runtime/backend/host_collectives.h"

namespace ddprun::runtime {
namespace {

// The shared-memory collectives, where this group has them and needs them (a group of one
// has nothing to exchange: the algorithms do its local part).
ShmCollectives* sharedMemoryOf(const CollectiveContext& ctx) { return ctx.links.size() > 1 ? ctx.shm : nullptr; }

// The algorithms' part of the context: a call with it runs the algorithm over the links.
const AlgorithmContext& overLinks(const CollectiveContext& ctx) { return ctx; }

}  // namespace

void allReduce(CollectiveContext ctx, void* buf, size_t count, DType dtype, ReduceOp op) {
  if (ShmCollectives* shm = sharedMemoryOf(ctx)) return shm->allReduce(buf, count, dtype, op, ctx.deadline);
  allReduce(overLinks(ctx), buf, count, dtype, op);
}

void broadcast(CollectiveContext ctx, void* buf, size_t bytes, int root) {
  ShmCollectives* shm = sharedMemoryOf(ctx);
  if (shm && bytes > 0) return shm->broadcast(buf, bytes, root, ctx.deadline);
  broadcast(overLinks(ctx), buf, bytes, root);
}

void allGather(CollectiveContext ctx, const void* in, void* out, size_t bytes_per_rank) {
  allGatherInto(ctx, in, blocksOf<void>(out, ctx.links.size(), bytes_per_rank).data(), bytes_per_rank);
}

void allGatherInto(CollectiveContext ctx, const void* in, void* const* outs, size_t bytes_per_rank) {
  ShmCollectives* shm = sharedMemoryOf(ctx);
  if (shm && bytes_per_rank > 0) return shm->allGather(in, outs, bytes_per_rank, ctx.deadline);
  allGatherInto(overLinks(ctx), in, outs, bytes_per_rank);
}

void reduceScatter(CollectiveContext ctx, const void* in, void* out, size_t count_per_rank, DType dtype, ReduceOp op) {
  reduceScatterFrom(ctx, blocksOf<const void>(in, ctx.links.size(), count_per_rank * dtypeSize(dtype)).data(), out,
                    count_per_rank, dtype, op);
}

void reduceScatterFrom(CollectiveContext ctx, const void* const* ins, void* out, size_t count_per_rank, DType dtype,
                       ReduceOp op) {
  ShmCollectives* shm = sharedMemoryOf(ctx);
  if (shm && count_per_rank * dtypeSize(dtype) > 0) {
    return shm->reduceScatter(ins, out, count_per_rank, dtype, op, ctx.deadline);
  }
  reduceScatterFrom(overLinks(ctx), ins, out, count_per_rank, dtype, op);
}

void barrier(CollectiveContext ctx) {
  if (ShmCollectives* shm = sharedMemoryOf(ctx)) return shm->barrier(ctx.deadline);
  barrier(overLinks(ctx));
}

void reduce(CollectiveContext ctx, void* buf, size_t count, DType dtype, ReduceOp op, int root) {
  reduce(overLinks(ctx), buf, count, dtype, op, root);
}

void gather(CollectiveContext ctx, const void* in, void* out, size_t bytes_per_rank, int root) {
  gather(overLinks(ctx), in, out, bytes_per_rank, root);
}

void scatter(CollectiveContext ctx, const void* in, void* out, size_t bytes_per_rank, int root) {
  scatter(overLinks(ctx), in, out, bytes_per_rank, root);
}

void allToAll(CollectiveContext ctx, const void* in, void* out, size_t bytes_per_rank) {
  allToAll(overLinks(ctx), in, out, bytes_per_rank);
}

void allToAllV(CollectiveContext ctx, std::span<const std::span<const uint8_t>> in,
               std::span<const std::span<uint8_t>> out) {
  allToAllV(overLinks(ctx), in, out);
}

}  // namespace ddprun::runtime
