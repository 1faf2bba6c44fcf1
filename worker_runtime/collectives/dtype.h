// Element types and reduction operators of the collectives, on raw buffers: the runtime's
// core never sees a torch tensor (only the torch-facing layer does), so it compiles fast
// and is testable without LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ddprun::runtime {

enum class DType : uint8_t { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8 };
enum class ReduceOp : uint8_t { kSum, kProduct, kMin, kMax, kAvg };

size_t dtypeSize(DType dtype);
std::string_view dtypeName(DType dtype);
std::string_view reduceOpName(ReduceOp op);

// acc[i] = acc[i] (op) in[i] for i < count. AVG accumulates like SUM; divideBy() finishes it.
// Half types are computed in float and rounded to nearest even. Integer overflow wraps.
// Thread-safe (no shared state); `acc` and `in` may not overlap unless equal.
void reduceInto(void* acc, const void* in, size_t count, DType dtype, ReduceOp op);

// buf[i] /= divisor, for AVG. Integer types divide with truncation toward zero, like torch.
void divideBy(void* buf, size_t count, DType dtype, int divisor);

}  // namespace ddprun::runtime
