#include <fmt/format.h>

#include "common/error.h"
#include "worker_runtime/backend/nccl_tensors_impl.h"

namespace ddprun::dist::nccl {

ncclDataType_t ncclTypeOf(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kChar: return ncclInt8;
    case at::kByte: return ncclUint8;
    case at::kBool: return ncclUint8;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kUInt32: return ncclUint32;
    case at::kUInt64: return ncclUint64;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case at::kFloat8_e4m3fn: return ncclFloat8e4m3;
    case at::kFloat8_e5m2: return ncclFloat8e5m2;
#endif
    default: throw DdprunError(fmt::format("{}: dtype {} has no NCCL type", what, c10::toString(t.scalar_type())));
  }
}

// Booleans reduce as torch's NCCL backend does: "sum" is or (max), "product" is and (min).
ncclRedOp_t ncclOpOf(ReduceOp op, const at::Tensor& t, const char* what) {
  const bool boolean = t.scalar_type() == at::kBool;
  switch (op) {
    case ReduceOp::SUM: return boolean ? ncclMax : ncclSum;
    case ReduceOp::PRODUCT: return boolean ? ncclMin : ncclProd;
    case ReduceOp::MIN: return ncclMin;
    case ReduceOp::MAX: return ncclMax;
    case ReduceOp::AVG:
      if (boolean) throw DdprunError(fmt::format("{}: AVG is not defined on bool tensors", what));
      return ncclAvg;
  }
  return ncclSum;
}

size_t bytesOf(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

}  // namespace ddprun::dist::nccl
