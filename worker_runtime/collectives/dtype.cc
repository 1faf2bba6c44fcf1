#include "worker_runtime/collectives/dtype.h"

#include <bit>
#include <cmath>
#include <string>
#include <type_traits>

#include "common/error.h"

namespace ddprun::runtime {
namespace {

// The project builds at -O2, where GCC's "very cheap" vectorizer cost model refuses loops
// whose trip count is unknown (they would need a scalar epilogue). Running the kernels on
// fixed-size blocks gives it a constant trip count, so every elementwise loop below
// vectorizes without raising the optimization level; only the last partial block is
// scalar. 256 elements keep a block of each operand well inside L1.
constexpr size_t kBlock = 256;

// Float and integer kernels keep up with memory at the baseline SSE2, but the half-type
// kernels are bound by their conversions, and AVX2/AVX-512 supply what SSE2 lacks (32->16
// packs, blends, unsigned compares). GCC clones just those functions per target and picks
// one at load time. Float16 sum on 16M elements: 1.3 GB/s (SSE2), 2.9 (AVX2), 6.3 (AVX-512).
// Not under ThreadSanitizer: the loader runs the clones' resolvers before the TSan runtime is
// up, and GCC instruments them, so the program would crash before main().
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define DDPRUN_HALF_KERNEL __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DDPRUN_HALF_KERNEL
#endif

// Integer overflow must wrap (the header promises it) but signed overflow is undefined in
// C++, so integer arithmetic goes through the unsigned type of the same width.
template <typename T>
T wrapAdd(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}

template <typename T>
T wrapMul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  // uint8_t promotes to int before multiplying; 255 * 255 still fits, and the cast wraps.
  return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
}

struct SumOp {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return wrapAdd(a, b);
    } else {
      return a + b;
    }
  }
};

struct ProductOp {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return wrapMul(a, b);
    } else {
      return a * b;
    }
  }
};

// torch.minimum/maximum semantics: NaN in either operand gives NaN. A plain `a < b ? a : b`
// would drop a NaN in `a`; testing `a != a` catches it and still compiles to selects.
struct MinOp {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return a < b ? a : b;
    } else {
      return (a < b || a != a) ? a : b;
    }
  }
};

struct MaxOp {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return a > b ? a : b;
    } else {
      return (a > b || a != a) ? a : b;
    }
  }
};

// Selects between two computed floats are written as bit masks: with `?:` GCC sinks each
// float computation into its own branch, and since float arithmetic may trap
// (-ftrapping-math) it then cannot turn the branches back into a vectorizable select.
inline int32_t allOnesIf(bool cond) { return -static_cast<int32_t>(cond); }

// IEEE binary16 <-> binary32 without branches, so the block loops vectorize (no F16C at
// the baseline x86-64 target). Bit patterns are handled as int32_t with every compared
// value non-negative: SSE2 and AVX2 have signed integer compares only.
struct Float16 {
  static float toFloat(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    const int32_t magnitude = h & 0x7FFF;
    // Normal: shift exponent and mantissa into place and rebias the exponent (15 -> 127).
    // Inf/NaN: force float's all-ones exponent; the NaN payload is kept, not quieted.
    const int32_t rebiased = (magnitude << 13) + (112 << 23);
    const int32_t normal = rebiased | (allOnesIf(magnitude >= 0x7C00) & (0xFF << 23));
    // Zero and subnormal: the mantissa times 2^-24, both steps exact. Going through an
    // integer conversion rather than a subnormal float operand keeps it correct (and
    // fast) when the thread runs with denormals-are-zero.
    const float subnormal = static_cast<float>(magnitude) * 0x1.0p-24f;
    const int32_t isSubnormal = allOnesIf(magnitude < 0x0400);
    const int32_t bits = (std::bit_cast<int32_t>(subnormal) & isSubnormal) | (normal & ~isSubnormal);
    return std::bit_cast<float>(static_cast<uint32_t>(bits) | sign);
  }

  // The rounding technique is the one in Maratyszcza's FP16 library (which c10::Half
  // uses), so every non-NaN result matches torch bit for bit.
  static uint16_t fromFloat(float f) {
    // Scaling |f| up by 2^112 turns anything above half's range into inf; scaling back by
    // 2^-110 leaves the value times 4, the headroom the addition below needs. Both
    // multiplications are exact otherwise.
    float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const int32_t w = std::bit_cast<int32_t>(f);
    // Adding a power of two above |f| (its exponent + 15) makes the FPU drop exactly the
    // mantissa bits half cannot hold, rounding them to nearest even; the floor on the
    // exponent makes the same addition produce half's subnormals.
    int32_t exponent = w & 0x7F800000;
    exponent = exponent < 0x38800000 ? 0x38800000 : exponent;
    // Unsigned: for inf and NaN the sum leaves int32's range (the result is masked below).
    base = std::bit_cast<float>(static_cast<uint32_t>(exponent) + 0x07800000u) + base;
    const int32_t bits = std::bit_cast<int32_t>(base);
    // A carry out of the mantissa bumps the exponent, up to inf, as it should.
    const int32_t nonsign = ((bits >> 13) & 0x7C00) + (bits & 0x0FFF);
    // NaN becomes the canonical quiet NaN, keeping its sign.
    const int32_t isNan = allOnesIf((w & 0x7FFFFFFF) > 0x7F800000);
    return static_cast<uint16_t>(((w >> 16) & 0x8000) | (0x7E00 & isNan) | (nonsign & ~isNan));
  }
};

// bfloat16 is the top half of a binary32, so widening is a shift and narrowing is a
// rounding add on the low 16 bits.
struct BFloat16 {
  static float toFloat(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

  static uint16_t fromFloat(float f) {
    const uint32_t w = std::bit_cast<uint32_t>(f);
    // Round to nearest even: add 0x7FFF plus the lowest bit that is kept. A carry into
    // the exponent is correct, including overflow to inf.
    const uint32_t rounded = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
    // NaN must not round (a payload only in the low bits would turn into inf); truncate
    // it and set the quiet bit, keeping sign and high payload as AVX512-BF16 does.
    const uint32_t quietNan = (w >> 16) | 0x0040u;
    const bool isNan = static_cast<int32_t>(w & 0x7FFFFFFFu) > 0x7F800000;  // signed: see above
    return static_cast<uint16_t>(isNan ? quietNan : rounded);
  }
};

template <typename T, typename Op, size_t N>
inline void reduceFixed(T* __restrict acc, const T* __restrict in) {
  for (size_t i = 0; i < N; ++i) acc[i] = Op::apply(acc[i], in[i]);
}

template <typename T, typename Op>
void reduceTail(T* __restrict acc, const T* __restrict in, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = Op::apply(acc[i], in[i]);
}

// Computing in float and rounding once gives the correctly rounded half result for +, *,
// and /: float's 24-bit significand is at least twice half's 11 bits plus two, so the
// double rounding is innocuous (and so for bfloat16's 8 bits).
template <typename H, typename Op, size_t N>
inline void reduceHalfFixed(uint16_t* __restrict acc, const uint16_t* __restrict in) {
  for (size_t i = 0; i < N; ++i) {
    acc[i] = H::fromFloat(Op::apply(H::toFloat(acc[i]), H::toFloat(in[i])));
  }
}

template <typename H, typename Op>
void reduceHalfTail(uint16_t* __restrict acc, const uint16_t* __restrict in, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    acc[i] = H::fromFloat(Op::apply(H::toFloat(acc[i]), H::toFloat(in[i])));
  }
}

// `acc == in` is allowed by the contract but would break the __restrict promise, so it
// gets its own single-pointer loop (a rare case: a rank reducing a buffer into itself).
template <typename T, typename Op>
void reduceSelf(T* buf, size_t count) {
  for (size_t i = 0; i < count; ++i) buf[i] = Op::apply(buf[i], buf[i]);
}

template <typename H, typename Op>
void reduceHalfSelf(uint16_t* buf, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const float x = H::toFloat(buf[i]);
    buf[i] = H::fromFloat(Op::apply(x, x));
  }
}

template <typename T, typename Op>
void reduceTyped(void* accRaw, const void* inRaw, size_t count) {
  auto* acc = static_cast<T*>(accRaw);
  const auto* in = static_cast<const T*>(inRaw);
  if (accRaw == inRaw) return reduceSelf<T, Op>(acc, count);
  size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) reduceFixed<T, Op, kBlock>(acc + i, in + i);
  reduceTail<T, Op>(acc + i, in + i, count - i);
}

template <typename H, typename Op>
DDPRUN_HALF_KERNEL void reduceHalf(void* accRaw, const void* inRaw, size_t count) {
  auto* acc = static_cast<uint16_t*>(accRaw);
  const auto* in = static_cast<const uint16_t*>(inRaw);
  if (accRaw == inRaw) return reduceHalfSelf<H, Op>(acc, count);
  size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) reduceHalfFixed<H, Op, kBlock>(acc + i, in + i);
  reduceHalfTail<H, Op>(acc + i, in + i, count - i);
}

template <typename Op>
void reduceDispatch(void* acc, const void* in, size_t count, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return reduceTyped<float, Op>(acc, in, count);
    case DType::kFloat64: return reduceTyped<double, Op>(acc, in, count);
    case DType::kFloat16: return reduceHalf<Float16, Op>(acc, in, count);
    case DType::kBFloat16: return reduceHalf<BFloat16, Op>(acc, in, count);
    case DType::kInt32: return reduceTyped<int32_t, Op>(acc, in, count);
    case DType::kInt64: return reduceTyped<int64_t, Op>(acc, in, count);
    case DType::kUInt8: return reduceTyped<uint8_t, Op>(acc, in, count);
  }
  DDPRUN_CHECK(false, "reduceInto: unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

// Floating point divides rather than multiplying by 1/divisor so each element is
// correctly rounded. Integers use C++ division, which truncates toward zero (torch's
// rounding_mode="trunc"); torch's own AVG rejects integer tensors, so this is our
// definition, not a compatibility promise.
template <typename T>
void divideTyped(void* bufRaw, size_t count, int divisor) {
  auto* buf = static_cast<T*>(bufRaw);
  if constexpr (std::is_integral_v<T>) {
    // int64_t keeps INT32_MIN / d and uint8 / d free of overflow for any positive d.
    const int64_t d = divisor;
    for (size_t i = 0; i < count; ++i) buf[i] = static_cast<T>(static_cast<int64_t>(buf[i]) / d);
  } else {
    const T d = static_cast<T>(divisor);
    size_t i = 0;
    for (; i + kBlock <= count; i += kBlock) {
      T* block = buf + i;
      for (size_t j = 0; j < kBlock; ++j) block[j] /= d;
    }
    for (; i < count; ++i) buf[i] /= d;
  }
}

template <typename H>
DDPRUN_HALF_KERNEL void divideHalf(void* bufRaw, size_t count, int divisor) {
  auto* buf = static_cast<uint16_t*>(bufRaw);
  const float d = static_cast<float>(divisor);
  size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    uint16_t* block = buf + i;
    for (size_t j = 0; j < kBlock; ++j) block[j] = H::fromFloat(H::toFloat(block[j]) / d);
  }
  for (; i < count; ++i) buf[i] = H::fromFloat(H::toFloat(buf[i]) / d);
}

}  // namespace

size_t dtypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kUInt8: return 1;
  }
  DDPRUN_CHECK(false, "dtypeSize: unknown dtype " + std::to_string(static_cast<int>(dtype)));
  return 0;
}

std::string_view dtypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
  }
  DDPRUN_CHECK(false, "dtypeName: unknown dtype " + std::to_string(static_cast<int>(dtype)));
  return {};
}

std::string_view reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProduct: return "product";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kAvg: return "avg";
  }
  DDPRUN_CHECK(false, "reduceOpName: unknown op " + std::to_string(static_cast<int>(op)));
  return {};
}

void reduceInto(void* acc, const void* in, size_t count, DType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return reduceDispatch<SumOp>(acc, in, count, dtype);
    case ReduceOp::kProduct: return reduceDispatch<ProductOp>(acc, in, count, dtype);
    case ReduceOp::kMin: return reduceDispatch<MinOp>(acc, in, count, dtype);
    case ReduceOp::kMax: return reduceDispatch<MaxOp>(acc, in, count, dtype);
  }
  DDPRUN_CHECK(false, "reduceInto: unknown op " + std::to_string(static_cast<int>(op)));
}

void divideBy(void* buf, size_t count, DType dtype, int divisor) {
  // The divisor is a world size; zero or negative is a caller bug, and negative would make
  // unsigned division meaningless.
  DDPRUN_CHECK(divisor > 0, "divideBy: divisor " + std::to_string(divisor));
  switch (dtype) {
    case DType::kFloat32: return divideTyped<float>(buf, count, divisor);
    case DType::kFloat64: return divideTyped<double>(buf, count, divisor);
    case DType::kFloat16: return divideHalf<Float16>(buf, count, divisor);
    case DType::kBFloat16: return divideHalf<BFloat16>(buf, count, divisor);
    case DType::kInt32: return divideTyped<int32_t>(buf, count, divisor);
    case DType::kInt64: return divideTyped<int64_t>(buf, count, divisor);
    case DType::kUInt8: return divideTyped<uint8_t>(buf, count, divisor);
  }
  DDPRUN_CHECK(false, "divideBy: unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace ddprun::runtime
