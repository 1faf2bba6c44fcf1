#include "tests/runtime/support/reference_values.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace ddprun::testing {
namespace {

// IEEE binary16 from its fields; only finite values occur in these tests.
double halfToDouble(uint16_t h) {
  const int exponent = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
  return (h & 0x8000) ? -magnitude : magnitude;
}

// bfloat16 is the top half of a binary32.
double bfloat16ToDouble(uint16_t b) {
  const uint32_t word = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &word, sizeof f);
  return f;
}

// The 16-bit pattern nearest to `value` (ties to the even pattern), by search: for
// non-negative finite values, patterns increase with the values they encode.
template <typename Decode>
uint16_t nearest16(double value, Decode decode, uint16_t max_finite) {
  const bool negative = std::signbit(value);
  const double magnitude = std::fabs(value);
  uint32_t lo = 0, hi = max_finite;  // first pattern whose value is >= magnitude
  while (lo < hi) {
    const uint32_t mid = (lo + hi) / 2;
    if (decode(static_cast<uint16_t>(mid)) < magnitude) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  uint32_t best = lo;
  if (lo > 0) {
    const double above = decode(static_cast<uint16_t>(lo)) - magnitude;
    const double below = magnitude - decode(static_cast<uint16_t>(lo - 1));
    if (below < above || (below == above && (lo - 1) % 2 == 0)) best = lo - 1;
  }
  return static_cast<uint16_t>(best | (negative ? 0x8000u : 0u));
}

uint16_t doubleToHalf(double v) { return nearest16(v, halfToDouble, 0x7BFF); }
uint16_t doubleToBFloat16(double v) { return nearest16(v, bfloat16ToDouble, 0x7F7F); }

bool isIntegral(DType dtype) { return dtype == DType::kInt32 || dtype == DType::kInt64 || dtype == DType::kUInt8; }

// `value` as the dtype holds it (round to nearest even for floating types).
double roundTo(DType dtype, double value) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<float>(value);
    case DType::kFloat64: return value;
    case DType::kFloat16: return halfToDouble(doubleToHalf(value));
    case DType::kBFloat16: return bfloat16ToDouble(doubleToBFloat16(value));
    default: break;
  }
  throw std::logic_error("roundTo: an integral dtype");
}

std::string typeName(DType dtype) { return std::string(runtime::dtypeName(dtype)); }

}  // namespace

size_t elementBytes(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
    case DType::kInt64: return 8;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kUInt8: return 1;
  }
  throw std::logic_error("elementBytes: unknown dtype");
}

int64_t inputValue(ReduceOp op, DType dtype, int rank, size_t index, int salt) {
  const bool unsigned_type = dtype == DType::kUInt8;
  const uint64_t r = static_cast<uint64_t>(rank), i = index, s = static_cast<uint64_t>(salt);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: {
      // [-4, 4]: any sum of 8 ranks stays within [-32, 32], exact even in bfloat16.
      const auto v = static_cast<int64_t>((r * 7 + i * 3 + s) % 9);
      return unsigned_type ? v : v - 4;
    }
    case ReduceOp::kProduct: {
      // Powers of two: any product of 8 ranks is exact in every floating type. uint8 takes
      // 1..3 so that products wrap past 255.
      if (unsigned_type) return static_cast<int64_t>(1 + (r * 5 + i + s) % 3);
      static const int64_t kFactors[] = {1, -1, 2, -2, 1};
      return kFactors[(r * 5 + i + s) % 5];
    }
    case ReduceOp::kMin:
    case ReduceOp::kMax: {
      const auto v = static_cast<int64_t>((r * 13 + i * 5 + s) % 17);
      return unsigned_type ? v : v - 8;
    }
  }
  throw std::logic_error("inputValue: unknown op");
}

double expectedValue(ReduceOp op, DType dtype, int world_size, size_t index, int salt) {
  int64_t acc = inputValue(op, dtype, 0, index, salt);
  for (int r = 1; r < world_size; ++r) {
    const int64_t v = inputValue(op, dtype, r, index, salt);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProduct: acc *= v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
    }
  }
  if (dtype == DType::kUInt8) acc &= 0xFF;  // uint8 arithmetic wraps
  if (op != ReduceOp::kAvg) return static_cast<double>(acc);
  // Integers divide with truncation toward zero (C++ division does); floating types round
  // the exact quotient once (the double quotient is close enough for every dtype here).
  if (isIntegral(dtype)) return static_cast<double>(acc / world_size);
  return roundTo(dtype, static_cast<double>(acc) / world_size);
}

double loadElement(const void* buf, size_t i, DType dtype) {
  const auto* bytes = static_cast<const uint8_t*>(buf) + i * elementBytes(dtype);
  auto read = [&](auto sample) {
    decltype(sample) v;
    std::memcpy(&v, bytes, sizeof v);
    return v;
  };
  switch (dtype) {
    case DType::kFloat32: return read(float{});
    case DType::kFloat64: return read(double{});
    case DType::kFloat16: return halfToDouble(read(uint16_t{}));
    case DType::kBFloat16: return bfloat16ToDouble(read(uint16_t{}));
    case DType::kInt32: return read(int32_t{});
    case DType::kInt64: return static_cast<double>(read(int64_t{}));
    case DType::kUInt8: return read(uint8_t{});
  }
  throw std::logic_error("loadElement: unknown dtype");
}

void storeElement(void* buf, size_t i, DType dtype, double value) {
  auto* bytes = static_cast<uint8_t*>(buf) + i * elementBytes(dtype);
  auto write = [&](auto v) { std::memcpy(bytes, &v, sizeof v); };
  switch (dtype) {
    case DType::kFloat32: return write(static_cast<float>(value));
    case DType::kFloat64: return write(value);
    case DType::kFloat16: return write(doubleToHalf(value));
    case DType::kBFloat16: return write(doubleToBFloat16(value));
    case DType::kInt32: return write(static_cast<int32_t>(value));
    case DType::kInt64: return write(static_cast<int64_t>(value));
    case DType::kUInt8: return write(static_cast<uint8_t>(static_cast<int64_t>(value) & 0xFF));
  }
  throw std::logic_error("storeElement: unknown dtype");
}

std::vector<uint8_t> inputBuffer(ReduceOp op, DType dtype, int rank, size_t count, int salt, size_t first) {
  std::vector<uint8_t> buf(count * elementBytes(dtype));
  for (size_t i = 0; i < count; ++i) {
    storeElement(buf.data(), i, dtype, static_cast<double>(inputValue(op, dtype, rank, first + i, salt)));
  }
  return buf;
}

void checkReduced(const std::string& what, const void* got, size_t count, ReduceOp op, DType dtype, int world_size,
                  int salt, size_t first) {
  for (size_t i = 0; i < count; ++i) {
    const double actual = loadElement(got, i, dtype);
    const double expected = expectedValue(op, dtype, world_size, first + i, salt);
    if (actual != expected) {
      throw std::runtime_error(fmt::format("{} ({} {}, {} elements, world size {}): element {} is {}, expected {}",
                                           what, runtime::reduceOpName(op), typeName(dtype), count, world_size, i,
                                           actual, expected));
    }
  }
}

uint8_t patternByte(int from, int to, size_t index, int salt) {
  return static_cast<uint8_t>(from * 37 + (to + 1) * 101 + index * 13 + static_cast<size_t>(salt) * 7 + 1);
}

std::vector<uint8_t> patternBlock(int from, int to, size_t bytes, int salt) {
  std::vector<uint8_t> block(bytes);
  for (size_t i = 0; i < bytes; ++i) block[i] = patternByte(from, to, i, salt);
  return block;
}

void checkPattern(const std::string& what, const uint8_t* got, size_t bytes, int from, int to, int salt) {
  for (size_t i = 0; i < bytes; ++i) {
    const uint8_t expected = patternByte(from, to, i, salt);
    if (got[i] != expected) {
      throw std::runtime_error(
          fmt::format("{}: byte {} of {} from rank {} is {}, expected {}", what, i, bytes, from, got[i], expected));
    }
  }
}

}  // namespace ddprun::testing
