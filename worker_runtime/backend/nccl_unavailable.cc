// The NCCL backend where the runtime is built against a LibTorch without CUDA: never viable.
#include "common/error.h"
#include "worker_runtime/backend/nccl_tensor_backend.h"

namespace ddprun::dist {

namespace {
constexpr const char* kWhy = "this ddprun runtime was built against a LibTorch without CUDA";
}

bool ncclViable(std::string* why) {
  if (why) *why = kWhy;
  return false;
}

std::unique_ptr<Backend> makeNcclBackend(const NcclGroup&) {
  throw DdprunError(std::string("backend nccl is not viable: ") + kWhy);
}

std::unique_ptr<Backend> splitNcclBackend(Backend* parent, const NcclGroup& group, bool member) {
  if (!parent || !member) return nullptr;
  return makeNcclBackend(group);
}

}  // namespace ddprun::dist
