#include "trainers/fashion_mnist_data.h"

#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "common/error.h"

namespace ddprun::trainers {
namespace {

// Fashion-MNIST's pixel statistics over the training set (after scaling to [0, 1]).
constexpr float kMean = 0.2860f;
constexpr float kStd = 0.3530f;

std::vector<uint8_t> readGzip(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    throw DdprunError("fashion-mnist: cannot open " + path + ": " + std::strerror(errno ? errno : ENOENT));
  }
  gzbuffer(file, 1 << 20);
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  while (true) {
    int n = gzread(file, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int code = 0;
      std::string why = gzerror(file, &code);
      gzclose(file);
      throw DdprunError("fashion-mnist: " + path + ": corrupt gzip data (" + why + ")");
    }
    if (n == 0) break;
    out.insert(out.end(), chunk.begin(), chunk.begin() + n);
  }
  gzclose(file);
  return out;
}

uint32_t bigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// An IDX file: magic 0x00 0x00 <type> <ndims>, ndims big-endian u32 sizes, then the data.
// Only unsigned bytes (type 0x08) occur in (Fashion-)MNIST.
at::Tensor parseIdx(const std::string& path, const std::vector<uint8_t>& bytes, int64_t expected_dims) {
  if (bytes.size() < 4 || bytes[0] != 0 || bytes[1] != 0) {
    throw DdprunError("fashion-mnist: " + path + ": not an IDX file (bad magic)");
  }
  if (bytes[2] != 0x08) {
    char type[8];
    std::snprintf(type, sizeof type, "0x%02x", bytes[2]);
    throw DdprunError("fashion-mnist: " + path + ": element type " + type +
                      ", only unsigned bytes (0x08) are supported");
  }
  const int64_t dims = bytes[3];
  if (dims != expected_dims) {
    throw DdprunError("fashion-mnist: " + path + ": " + std::to_string(dims) + " dimensions, expected " +
                      std::to_string(expected_dims));
  }
  const size_t header = 4 + 4 * static_cast<size_t>(dims);
  if (bytes.size() < header) throw DdprunError("fashion-mnist: " + path + ": truncated header");
  std::vector<int64_t> shape;
  size_t count = 1;
  for (int64_t d = 0; d < dims; ++d) {
    shape.push_back(bigEndian32(bytes.data() + 4 + 4 * d));
    count *= static_cast<size_t>(shape.back());
  }
  if (bytes.size() - header != count) {
    throw DdprunError("fashion-mnist: " + path + ": " + std::to_string(bytes.size() - header) +
                      " bytes of data, the header promises " + std::to_string(count));
  }
  at::Tensor out = at::empty(shape, at::kByte);
  std::memcpy(out.data_ptr<uint8_t>(), bytes.data() + header, count);
  return out;
}

uint64_t splitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [0, bound) by rejection: no modulo bias, no library-defined distribution.
uint64_t uniformBelow(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return x % bound;
}

}  // namespace

Dataset loadIdxPair(const std::string& images_path, const std::string& labels_path) {
  Dataset data;
  data.images = parseIdx(images_path, readGzip(images_path), 3);
  at::Tensor labels = parseIdx(labels_path, readGzip(labels_path), 1);
  if (labels.size(0) != data.images.size(0)) {
    throw DdprunError("fashion-mnist: " + labels_path + " has " + std::to_string(labels.size(0)) + " labels, " +
                      images_path + " has " + std::to_string(data.images.size(0)) + " images");
  }
  if (labels.numel() > 0 && labels.max().item<int64_t>() > 9) {
    throw DdprunError("fashion-mnist: " + labels_path + ": label " + std::to_string(labels.max().item<int64_t>()) +
                      " outside 0-9");
  }
  data.labels = labels.to(at::kLong);
  return data;
}

Dataset loadFashionMnist(const std::string& dir, bool train) {
  const std::string prefix = dir + (train ? "/train" : "/t10k");
  return loadIdxPair(prefix + "-images-idx3-ubyte.gz", prefix + "-labels-idx1-ubyte.gz");
}

std::pair<at::Tensor, at::Tensor> makeBatch(const Dataset& data, const std::vector<int64_t>& indices, size_t begin,
                                            size_t end) {
  at::Tensor idx =
      at::from_blob(const_cast<int64_t*>(indices.data() + begin), {static_cast<int64_t>(end - begin)}, at::kLong);
  at::Tensor x = data.images.index_select(0, idx).to(at::kFloat).div_(255.0f).sub_(kMean).div_(kStd).unsqueeze(1);
  return {x, data.labels.index_select(0, idx)};
}

DataPartitioner::DataPartitioner(int64_t size, int world, int rank, uint64_t seed)
    : size_(size), world_(world), rank_(rank), seed_(seed) {
  if (world < 1 || rank < 0 || rank >= world) {
    throw UsageError("data partitioner: rank " + std::to_string(rank) + " outside a world of " + std::to_string(world));
  }
  if (size < world) {
    throw UsageError("data partitioner: " + std::to_string(size) + " samples cannot be split over " +
                     std::to_string(world) + " ranks");
  }
}

std::vector<int64_t> DataPartitioner::permutation(int64_t size, uint64_t seed, int64_t epoch) {
  std::mt19937_64 rng(splitMix64(seed ^ splitMix64(static_cast<uint64_t>(epoch))));
  std::vector<int64_t> order(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) order[static_cast<size_t>(i)] = i;
  for (int64_t i = size - 1; i > 0; --i) {
    std::swap(order[static_cast<size_t>(i)], order[uniformBelow(rng, static_cast<uint64_t>(i) + 1)]);
  }
  return order;
}

std::vector<int64_t> DataPartitioner::epochIndices(int64_t epoch) const {
  const auto order = permutation(size_, seed_, epoch);
  const int64_t slice = sliceSize();
  return {order.begin() + rank_ * slice, order.begin() + (rank_ + 1) * slice};
}

}  // namespace ddprun::trainers
