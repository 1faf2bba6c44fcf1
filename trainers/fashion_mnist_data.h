// Fashion-MNIST for the trainers: the IDX files (gzip, as Debian's dataset-fashion-mnist
// ships them in /usr/share/datasets/fashion-mnist) read with zlib into uint8 tensors, the
// normalisation the convnet expects, and the data partitioner of PyTorch's "Writing
// Distributed Applications" tutorial: each rank trains on its own slice of the data,
// reshuffled every epoch from a seed, so every rank can compute any epoch's order on its
// own and a resumed run sees exactly the order the interrupted one would have.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ddprun::trainers {

// Where the build says (DDPRUN_FASHION_MNIST_DIR: a GPU machine without Debian's package gets
// the package's files unpacked elsewhere by scripts/gpu-build), else Debian's path.
#ifndef DDPRUN_FASHION_MNIST_DIR
#define DDPRUN_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
#endif
inline constexpr const char* kFashionMnistDir = DDPRUN_FASHION_MNIST_DIR;

struct Dataset {
  at::Tensor images;  // uint8 [N, rows, cols]
  at::Tensor labels;  // int64 [N], each in [0, 10)
  int64_t size() const { return labels.size(0); }
};

// Reads an IDX images/labels pair (gzip-compressed or plain). Throws DdprunError naming
// the file and the problem (missing, not gzip/IDX, wrong element type, counts that
// disagree, truncated, a label outside 0-9).
Dataset loadIdxPair(const std::string& images_path, const std::string& labels_path);

// train-*-ubyte.gz (60000 samples) or t10k-*-ubyte.gz (10000) from `dir`.
Dataset loadFashionMnist(const std::string& dir, bool train);

// The samples at `indices` as a float batch [B, 1, rows, cols], scaled to [0, 1] and
// normalised with Fashion-MNIST's mean and standard deviation, and their labels [B].
std::pair<at::Tensor, at::Tensor> makeBatch(const Dataset& data, const std::vector<int64_t>& indices, size_t begin,
                                            size_t end);

// Splits `size` samples over `world` ranks in equal slices of size / world (each epoch
// leaves out a different remainder). Every epoch's order is a permutation drawn from
// (seed, epoch) alone, identical on every rank and platform.
class DataPartitioner {
 public:
  // Throws UsageError unless 0 <= rank < world and size >= world.
  DataPartitioner(int64_t size, int world, int rank, uint64_t seed);

  // This rank's sample indices for `epoch`, in training order.
  std::vector<int64_t> epochIndices(int64_t epoch) const;
  int64_t sliceSize() const { return size_ / world_; }

  // The whole permutation of [0, size) for (seed, epoch): Fisher-Yates over a 64-bit
  // Mersenne Twister seeded by a SplitMix64 mix of the two (no implementation-defined
  // distributions, so the order does not depend on the standard library).
  static std::vector<int64_t> permutation(int64_t size, uint64_t seed, int64_t epoch);

 private:
  int64_t size_;
  int world_;
  int rank_;
  uint64_t seed_;
};

}  // namespace ddprun::trainers
