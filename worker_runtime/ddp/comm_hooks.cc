// The built-in communication hooks (see distributed_data_parallel.h).
#include <ATen/ATen.h>

#include "worker_runtime/ddp/distributed_data_parallel.h"

namespace ddprun::ddp {

HookResult allreduce_hook(const dist::Group& group, GradBucket& bucket) {
  at::Tensor buffer = bucket.buffer();
  // AVG divides on the collective thread, in the same pass that writes the result.
  auto work = dist::all_reduce(buffer, dist::ReduceOp::AVG, group, /*async_op=*/true);
  return {std::move(work), [buffer] { return buffer; }};
}

namespace {

HookResult compressedHook(const dist::Group& group, GradBucket& bucket, at::ScalarType wire_type) {
  at::Tensor buffer = bucket.buffer();
  // Divide before compressing, as torch does: the sum of n full-range halves could overflow.
  at::Tensor compressed = buffer.to(wire_type).div_(dist::get_world_size(group));
  auto work = dist::all_reduce(compressed, dist::ReduceOp::SUM, group, /*async_op=*/true);
  return {std::move(work), [buffer, compressed]() mutable { return buffer.copy_(compressed); }};
}

}  // namespace

HookResult fp16_compress_hook(const dist::Group& group, GradBucket& bucket) {
  return compressedHook(group, bucket, at::kHalf);
}

HookResult bf16_compress_hook(const dist::Group& group, GradBucket& bucket) {
  return compressedHook(group, bucket, at::kBFloat16);
}

}  // namespace ddprun::ddp
