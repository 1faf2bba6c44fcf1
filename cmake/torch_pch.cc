// The target that owns LibTorch's precompiled header (cmake/TorchPch.cmake) needs one source.
namespace ddprun::internal {
int torchPchAnchor() { return 0; }
}  // namespace ddprun::internal
