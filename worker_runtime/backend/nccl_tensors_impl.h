// How tensors go through NCCL: their dtypes and reduction ops as NCCL names them, and the
// contiguous buffers NCCL reads and writes. The NCCL backend's insides
// (nccl_tensor_backend.h), built only against a CUDA-enabled LibTorch.
#pragma once

#include <nccl.h>

#include <cstddef>

#include <ATen/ATen.h>

#include "worker_runtime/backend/backend.h"

namespace ddprun::dist::nccl {

// The NCCL type of `t`'s dtype. Throws DdprunError naming `what` (the op) for a dtype NCCL
// lacks.
ncclDataType_t ncclTypeOf(const at::Tensor& t, const char* what);

// Booleans reduce as torch's NCCL backend does: "sum" is or (max), "product" is and (min).
// Throws DdprunError naming `what` for AVG on bool.
ncclRedOp_t ncclOpOf(ReduceOp op, const at::Tensor& t, const char* what);

// The bytes `t`'s elements take.
size_t bytesOf(const at::Tensor& t);

// A tensor as NCCL sees it: contiguous. A non-contiguous one goes through a contiguous copy,
// made on the communication stream just before the op (load()) and written back there after
// it (finish()). Copied on the caller's stream instead, an op issued after an async one on the
// same tensor read it before the async op's result was written back (the caller's stream
// waits for the communication stream only in wait()).
struct Staged {
  at::Tensor user;
  at::Tensor buf;
  void load() {
    if (!buf.is_same(user)) buf.copy_(user);
  }
  void finish() {
    if (!buf.is_same(user)) user.copy_(buf);
  }
};

inline Staged stage(const at::Tensor& t) {
  return Staged{t, t.is_contiguous() ? t : at::empty(t.sizes(), t.options())};
}

}  // namespace ddprun::dist::nccl
