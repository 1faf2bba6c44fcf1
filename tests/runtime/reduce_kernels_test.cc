// reduceInto/divideBy against references computed here in double, with half types encoded
// and decoded by a deliberately different method (frexp/ldexp/nearbyint) than the kernels'
// bit tricks. Rounding a double result once is exact for these checks: double's 53 bits
// are at least twice the target's significand plus two, so rounding via double matches
// correct rounding of the exact result.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "worker_runtime/collectives/dtype.h"

using ddprun::runtime::divideBy;
using ddprun::runtime::DType;
using ddprun::runtime::dtypeName;
using ddprun::runtime::dtypeSize;
using ddprun::runtime::reduceInto;
using ddprun::runtime::ReduceOp;
using ddprun::runtime::reduceOpName;

namespace {

// A binary floating-point format with `mantBits` stored significand bits and `expBits`
// exponent bits: (10, 5) is IEEE half, (7, 8) is bfloat16.
struct MiniFormat {
  int mantBits;
  int expBits;
  int bias() const { return (1 << (expBits - 1)) - 1; }
  uint32_t expField() const { return (1u << expBits) - 1; }
  uint16_t signBit() const { return static_cast<uint16_t>(1u << (mantBits + expBits)); }
};
constexpr MiniFormat kHalf{10, 5};
constexpr MiniFormat kBf16{7, 8};

double decode(uint16_t bits, MiniFormat f) {
  const bool negative = (bits & f.signBit()) != 0;
  const uint32_t e = (bits >> f.mantBits) & f.expField();
  const uint32_t m = bits & ((1u << f.mantBits) - 1);
  double v;
  if (e == f.expField()) {
    v = m != 0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - f.bias() - f.mantBits);
  } else {
    v = std::ldexp(static_cast<double>(m + (1u << f.mantBits)), static_cast<int>(e) - f.bias() - f.mantBits);
  }
  return negative ? -v : v;
}

// Round to nearest even (nearbyint under the default rounding mode).
uint16_t encode(double x, MiniFormat f) {
  const uint16_t sign = std::signbit(x) ? f.signBit() : 0;
  const uint16_t inf = static_cast<uint16_t>(f.expField() << f.mantBits);
  if (std::isnan(x)) return static_cast<uint16_t>(sign | inf | (1u << (f.mantBits - 1)));
  const double ax = std::fabs(x);
  if (std::isinf(ax)) return sign | inf;
  int e = 0;
  std::frexp(ax, &e);                            // ax = m * 2^e, m in [0.5, 1)
  int exponent = std::max(e - 1, 1 - f.bias());  // subnormals share the minimum exponent
  double q = std::nearbyint(std::ldexp(ax, f.mantBits - exponent));
  const double implicitOne = std::ldexp(1.0, f.mantBits);
  if (q >= 2 * implicitOne) {  // rounded up to the next binade
    q /= 2;
    ++exponent;
  }
  if (exponent > f.bias()) return sign | inf;
  if (q < implicitOne) return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));  // subnormal
  const auto field = static_cast<uint32_t>(exponent + f.bias());
  return static_cast<uint16_t>(sign | (field << f.mantBits) | static_cast<uint32_t>(q - implicitOne));
}

bool isNanBits(uint16_t bits, MiniFormat f) { return std::isnan(decode(bits, f)); }

const std::vector<DType> kAllTypes{DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                                   DType::kInt32,   DType::kInt64,   DType::kUInt8};
const std::vector<ReduceOp> kAllOps{ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg};

// The reference operator on doubles: NaN in either operand wins for MIN and MAX.
double refOp(double a, double b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return a + b;
    case ReduceOp::kProduct: return a * b;
    case ReduceOp::kMin:
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
      return std::min(a, b);
    case ReduceOp::kMax:
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
      return std::max(a, b);
  }
  return 0;
}

// Integers: compute exactly in 128 bits and wrap by conversion (modular since C++20).
__extension__ typedef __int128 Int128;
template <typename T>
T refIntOp(T a, T b, ReduceOp op) {
  const Int128 x = a;
  const Int128 y = b;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return static_cast<T>(static_cast<uint64_t>(x + y));
    case ReduceOp::kProduct: return static_cast<T>(static_cast<uint64_t>(x * y));
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
  }
  return 0;
}

// Half of the values are random bit patterns (every class: NaN, inf, subnormal, huge),
// half are moderate numbers, so sums of comparable magnitudes and ties get exercised.
std::vector<uint16_t> randomMini(size_t count, MiniFormat f, std::mt19937_64& rng) {
  std::vector<uint16_t> v(count);
  std::uniform_real_distribution<double> moderate(-100.0, 100.0);
  for (auto& x : v) x = rng() % 2 ? static_cast<uint16_t>(rng()) : encode(moderate(rng), f);
  return v;
}

template <typename T>
std::vector<T> randomFloats(size_t count, std::mt19937_64& rng) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  std::vector<T> v(count);
  std::uniform_real_distribution<T> moderate(-1000, 1000);
  for (auto& x : v) x = rng() % 2 ? std::bit_cast<T>(static_cast<Bits>(rng())) : moderate(rng);
  return v;
}

template <typename T>
std::vector<T> randomInts(size_t count, std::mt19937_64& rng) {
  std::vector<T> v(count);
  // Small values as well as full-range ones, so products do not all wrap to noise.
  for (auto& x : v) x = static_cast<T>(rng() % 4 == 0 ? rng() % 16 : rng());
  return v;
}

template <typename T>
bool sameFloat(T got, T want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == want;  // +0 == -0: which zero MIN/MAX keep is not part of the contract
}

// Checks one dtype x op over `count` random elements; returns the first mismatch's index
// or -1, and reports it, so a failure names the element instead of a million CHECKs.
template <typename T, typename Expect>
long long firstMismatch(const std::vector<T>& acc, const std::vector<T>& in, ReduceOp op, DType dtype, Expect expect) {
  std::vector<T> got = acc;
  reduceInto(got.data(), in.data(), got.size(), dtype, op);
  for (size_t i = 0; i < got.size(); ++i) {
    if (!expect(acc[i], in[i], got[i])) {
      if constexpr (std::is_floating_point_v<T>) {
        UNSCOPED_INFO("element " << i << ": " << acc[i] << " op " << in[i] << " gave " << got[i]);
      } else {
        UNSCOPED_INFO("element " << i << ": " << +acc[i] << " op " << +in[i] << " gave " << +got[i]);
      }
      return static_cast<long long>(i);
    }
  }
  return -1;
}

long long checkMini(DType dtype, ReduceOp op, const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  const MiniFormat f = dtype == DType::kFloat16 ? kHalf : kBf16;
  return firstMismatch(a, b, op, dtype, [op, f](uint16_t x, uint16_t y, uint16_t got) {
    const uint16_t want = encode(refOp(decode(x, f), decode(y, f), op), f);
    if (isNanBits(want, f)) return isNanBits(got, f);
    return got == want || (decode(got, f) == 0 && decode(want, f) == 0);
  });
}

long long checkRandom(DType dtype, ReduceOp op, size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  switch (dtype) {
    case DType::kFloat32: {
      auto a = randomFloats<float>(count, rng), b = randomFloats<float>(count, rng);
      return firstMismatch(a, b, op, dtype, [op](float x, float y, float got) {
        return sameFloat(got, static_cast<float>(refOp(x, y, op)));
      });
    }
    case DType::kFloat64: {
      auto a = randomFloats<double>(count, rng), b = randomFloats<double>(count, rng);
      return firstMismatch(a, b, op, dtype,
                           [op](double x, double y, double got) { return sameFloat(got, refOp(x, y, op)); });
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      const MiniFormat f = dtype == DType::kFloat16 ? kHalf : kBf16;
      return checkMini(dtype, op, randomMini(count, f, rng), randomMini(count, f, rng));
    }
    case DType::kInt32: {
      auto a = randomInts<int32_t>(count, rng), b = randomInts<int32_t>(count, rng);
      return firstMismatch(a, b, op, dtype,
                           [op](int32_t x, int32_t y, int32_t got) { return got == refIntOp(x, y, op); });
    }
    case DType::kInt64: {
      auto a = randomInts<int64_t>(count, rng), b = randomInts<int64_t>(count, rng);
      return firstMismatch(a, b, op, dtype,
                           [op](int64_t x, int64_t y, int64_t got) { return got == refIntOp(x, y, op); });
    }
    case DType::kUInt8: {
      auto a = randomInts<uint8_t>(count, rng), b = randomInts<uint8_t>(count, rng);
      return firstMismatch(a, b, op, dtype,
                           [op](uint8_t x, uint8_t y, uint8_t got) { return got == refIntOp(x, y, op); });
    }
  }
  return 0;
}

uint16_t reduceHalfPair(uint16_t a, uint16_t b, DType dtype, ReduceOp op) {
  reduceInto(&a, &b, 1, dtype, op);
  return a;
}

}  // namespace

TEST_CASE("dtype sizes and names", "[dtype]") {
  CHECK(dtypeSize(DType::kFloat32) == 4);
  CHECK(dtypeSize(DType::kFloat64) == 8);
  CHECK(dtypeSize(DType::kFloat16) == 2);
  CHECK(dtypeSize(DType::kBFloat16) == 2);
  CHECK(dtypeSize(DType::kInt32) == 4);
  CHECK(dtypeSize(DType::kInt64) == 8);
  CHECK(dtypeSize(DType::kUInt8) == 1);
  CHECK(dtypeName(DType::kFloat32) == "float32");
  CHECK(dtypeName(DType::kFloat64) == "float64");
  CHECK(dtypeName(DType::kFloat16) == "float16");
  CHECK(dtypeName(DType::kBFloat16) == "bfloat16");
  CHECK(dtypeName(DType::kInt32) == "int32");
  CHECK(dtypeName(DType::kInt64) == "int64");
  CHECK(dtypeName(DType::kUInt8) == "uint8");
  CHECK(reduceOpName(ReduceOp::kSum) == "sum");
  CHECK(reduceOpName(ReduceOp::kProduct) == "product");
  CHECK(reduceOpName(ReduceOp::kMin) == "min");
  CHECK(reduceOpName(ReduceOp::kMax) == "max");
  CHECK(reduceOpName(ReduceOp::kAvg) == "avg");
}

TEST_CASE("the test's own half encoder agrees with known bit patterns", "[dtype]") {
  CHECK(encode(1.0, kHalf) == 0x3C00);
  CHECK(encode(-2.0, kHalf) == 0xC000);
  CHECK(encode(65504.0, kHalf) == 0x7BFF);
  CHECK(encode(65520.0, kHalf) == 0x7C00);  // the tie above the largest half rounds to inf
  CHECK(encode(std::ldexp(1.0, -24), kHalf) == 0x0001);
  CHECK(encode(std::ldexp(1.0, -14), kHalf) == 0x0400);
  CHECK(encode(1.0, kBf16) == 0x3F80);
  CHECK(decode(0x7F7F, kBf16) == std::ldexp(255.0, 120));
}

TEST_CASE("every dtype and op matches the double reference", "[reduce]") {
  // Sizes around the kernels' 256-element blocks, odd ones, and one large odd count.
  const std::vector<size_t> counts{1, 7, 255, 256, 257, 513, 1000003};
  uint64_t seed = 1;
  for (DType dtype : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      for (size_t count : counts) {
        INFO(std::string(dtypeName(dtype)) << " " << reduceOpName(op) << " count " << count);
        CHECK(checkRandom(dtype, op, count, seed++) == -1);
      }
    }
  }
}

TEST_CASE("every float16 and bfloat16 bit pattern converts and rounds correctly", "[reduce][half]") {
  // Each of the 65536 patterns against partners that hit the edges: zeros, one, the
  // smallest and largest subnormal and normal, a half-ulp of one, inf, NaN.
  const std::vector<uint16_t> halfPartners{0x0000, 0x8000, 0x3C00, 0xBC00, 0x0001, 0x03FF, 0x0400,
                                           0x7BFF, 0x1000, 0x3800, 0x7C00, 0x7E00, 0xC500};
  const std::vector<uint16_t> bf16Partners{0x0000, 0x8000, 0x3F80, 0xBF80, 0x0001, 0x007F, 0x0080,
                                           0x7F7F, 0x3B80, 0x3F00, 0x7F80, 0x7FC0, 0xC0A0};
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const auto& partners = dtype == DType::kFloat16 ? halfPartners : bf16Partners;
    std::vector<uint16_t> a, b;
    for (uint16_t partner : partners) {
      for (uint32_t bits = 0; bits < 65536; ++bits) {
        a.push_back(static_cast<uint16_t>(bits));
        b.push_back(partner);
      }
    }
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
      INFO(std::string(dtypeName(dtype)) << " " << reduceOpName(op));
      CHECK(checkMini(dtype, op, a, b) == -1);
      CHECK(checkMini(dtype, op, b, a) == -1);
    }
  }
}

TEST_CASE("count 0 touches nothing, even through null pointers", "[reduce]") {
  for (DType dtype : kAllTypes) {
    for (ReduceOp op : kAllOps) reduceInto(nullptr, nullptr, 0, dtype, op);
    divideBy(nullptr, 0, dtype, 3);
  }
  float acc = 1.0f;
  const float in = 2.0f;
  reduceInto(&acc, &in, 0, DType::kFloat32, ReduceOp::kSum);
  CHECK(acc == 1.0f);
}

TEST_CASE("reducing a buffer into itself is allowed", "[reduce]") {
  std::vector<float> f(1000, 3.0f);
  reduceInto(f.data(), f.data(), f.size(), DType::kFloat32, ReduceOp::kSum);
  CHECK(std::all_of(f.begin(), f.end(), [](float x) { return x == 6.0f; }));
  std::vector<uint16_t> h(300, 0x3C00);  // 1.0
  reduceInto(h.data(), h.data(), h.size(), DType::kFloat16, ReduceOp::kSum);
  CHECK(std::all_of(h.begin(), h.end(), [](uint16_t x) { return x == 0x4000; }));
  std::vector<int32_t> i(300, 7);
  reduceInto(i.data(), i.data(), i.size(), DType::kInt32, ReduceOp::kProduct);
  CHECK(std::all_of(i.begin(), i.end(), [](int32_t x) { return x == 49; }));
}

TEST_CASE("float16 rounds to nearest even at known bit patterns", "[reduce][half]") {
  const DType h = DType::kFloat16;
  CHECK(reduceHalfPair(0x3C00, 0x3C00, h, ReduceOp::kSum) == 0x4000);      // 1 + 1 = 2
  CHECK(reduceHalfPair(0x3C00, 0xBC00, h, ReduceOp::kSum) == 0x0000);      // 1 - 1 = +0
  CHECK(reduceHalfPair(0x7BFF, 0x4800, h, ReduceOp::kSum) == 0x7BFF);      // 65504 + 8 stays
  CHECK(reduceHalfPair(0x7BFF, 0x4C00, h, ReduceOp::kSum) == 0x7C00);      // 65504 + 16 ties to inf
  CHECK(reduceHalfPair(0xFBFF, 0xCC00, h, ReduceOp::kSum) == 0xFC00);      // and to -inf
  CHECK(reduceHalfPair(0x7BFF, 0x4000, h, ReduceOp::kProduct) == 0x7C00);  // 65504 * 2 overflows
  CHECK(reduceHalfPair(0x3C00, 0x1000, h, ReduceOp::kSum) == 0x3C00);      // 1 + 2^-11 ties to even 1
  CHECK(reduceHalfPair(0x3C01, 0x1000, h, ReduceOp::kSum) == 0x3C02);      // ties up to even
  CHECK(reduceHalfPair(0x3C00, 0x1001, h, ReduceOp::kSum) == 0x3C01);      // above the tie rounds up
  CHECK(reduceHalfPair(0x0001, 0x0001, h, ReduceOp::kSum) == 0x0002);      // subnormals add exactly
  CHECK(reduceHalfPair(0x03FF, 0x0001, h, ReduceOp::kSum) == 0x0400);      // into the first normal
  CHECK(reduceHalfPair(0x0001, 0x3800, h, ReduceOp::kProduct) == 0x0000);  // 2^-25 ties to even 0
  CHECK(reduceHalfPair(0x0003, 0x3800, h, ReduceOp::kProduct) == 0x0002);  // 1.5 * 2^-24 ties to 2
  CHECK(reduceHalfPair(0x8001, 0x3800, h, ReduceOp::kProduct) == 0x8000);  // negative underflow keeps sign
  CHECK(reduceHalfPair(0x7C00, 0x3C00, h, ReduceOp::kSum) == 0x7C00);      // inf + 1
  CHECK(reduceHalfPair(0x7C00, 0x7BFF, h, ReduceOp::kMin) == 0x7BFF);
  CHECK(reduceHalfPair(0xFC00, 0x7BFF, h, ReduceOp::kMin) == 0xFC00);
  CHECK(isNanBits(reduceHalfPair(0x7C00, 0xFC00, h, ReduceOp::kSum), kHalf));  // inf - inf
}

TEST_CASE("bfloat16 rounds to nearest even at known bit patterns", "[reduce][half]") {
  const DType b = DType::kBFloat16;
  CHECK(reduceHalfPair(0x3F80, 0x3F80, b, ReduceOp::kSum) == 0x4000);  // 1 + 1 = 2
  CHECK(reduceHalfPair(0x3F80, 0x3B80, b, ReduceOp::kSum) == 0x3F80);  // 1 + 2^-8 ties to even 1
  CHECK(reduceHalfPair(0x3F81, 0x3B80, b, ReduceOp::kSum) == 0x3F82);  // ties up to even
  CHECK(reduceHalfPair(0x3F80, 0x3B81, b, ReduceOp::kSum) == 0x3F81);  // above the tie rounds up
  CHECK(reduceHalfPair(0x7F7F, 0x7F7F, b, ReduceOp::kSum) == 0x7F80);  // max + max overflows
  CHECK(reduceHalfPair(0x7F7F, 0x4000, b, ReduceOp::kProduct) == 0x7F80);
  CHECK(reduceHalfPair(0x0001, 0x0001, b, ReduceOp::kSum) == 0x0002);      // subnormals
  CHECK(reduceHalfPair(0x0001, 0x3F00, b, ReduceOp::kProduct) == 0x0000);  // ties to even 0
  // NaN inputs, signaling and negative ones included, stay NaN through the rounding.
  CHECK(isNanBits(reduceHalfPair(0x7F81, 0x3F80, b, ReduceOp::kSum), kBf16));
  CHECK(isNanBits(reduceHalfPair(0x3F80, 0xFF81, b, ReduceOp::kMax), kBf16));
}

TEST_CASE("MIN and MAX propagate NaN from either side", "[reduce][nan]") {
  const float fnan = std::numeric_limits<float>::quiet_NaN();
  const double dnan = std::numeric_limits<double>::quiet_NaN();
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kSum, ReduceOp::kProduct}) {
    INFO(reduceOpName(op));
    // Long enough to go through the vectorized blocks, NaN on alternating sides.
    std::vector<float> fa(1000, 1.0f), fb(1000, 2.0f);
    std::vector<double> da(1000, 1.0), db(1000, 2.0);
    std::vector<uint16_t> ha(1000, 0x3C00), hb(1000, 0x4000), ba(1000, 0x3F80), bb(1000, 0x4000);
    for (size_t i = 0; i < 1000; i += 2) {
      fa[i] = fnan;
      fb[i + 1] = fnan;
      da[i] = dnan;
      db[i + 1] = dnan;
      ha[i] = 0x7E00;
      hb[i + 1] = 0xFE00;
      ba[i] = 0x7FC0;
      bb[i + 1] = 0xFFC0;
    }
    reduceInto(fa.data(), fb.data(), fa.size(), DType::kFloat32, op);
    reduceInto(da.data(), db.data(), da.size(), DType::kFloat64, op);
    reduceInto(ha.data(), hb.data(), ha.size(), DType::kFloat16, op);
    reduceInto(ba.data(), bb.data(), ba.size(), DType::kBFloat16, op);
    CHECK(std::all_of(fa.begin(), fa.end(), [](float x) { return std::isnan(x); }));
    CHECK(std::all_of(da.begin(), da.end(), [](double x) { return std::isnan(x); }));
    CHECK(std::all_of(ha.begin(), ha.end(), [](uint16_t x) { return isNanBits(x, kHalf); }));
    CHECK(std::all_of(ba.begin(), ba.end(), [](uint16_t x) { return isNanBits(x, kBf16); }));
  }
}

TEST_CASE("integer overflow wraps", "[reduce][int]") {
  uint8_t u = 200;
  const uint8_t uin = 100;
  reduceInto(&u, &uin, 1, DType::kUInt8, ReduceOp::kSum);
  CHECK(u == 44);
  reduceInto(&u, &uin, 1, DType::kUInt8, ReduceOp::kProduct);
  CHECK(u == static_cast<uint8_t>(4400 % 256));
  int32_t i = std::numeric_limits<int32_t>::max();
  const int32_t one = 1;
  reduceInto(&i, &one, 1, DType::kInt32, ReduceOp::kSum);
  CHECK(i == std::numeric_limits<int32_t>::min());
  int64_t l = std::numeric_limits<int64_t>::max();
  const int64_t two = 2;
  reduceInto(&l, &two, 1, DType::kInt64, ReduceOp::kProduct);
  CHECK(l == -2);
}

TEST_CASE("AVG accumulates as SUM", "[reduce][avg]") {
  std::vector<float> acc{1, 2, 3}, in{4, 5, 6};
  reduceInto(acc.data(), in.data(), acc.size(), DType::kFloat32, ReduceOp::kAvg);
  CHECK(acc == std::vector<float>{5, 7, 9});
}

TEST_CASE("divideBy truncates integers toward zero and rounds floats", "[divide]") {
  std::vector<int32_t> i{7, -7, 6, -1, std::numeric_limits<int32_t>::min()};
  divideBy(i.data(), i.size(), DType::kInt32, 2);
  CHECK(i == std::vector<int32_t>{3, -3, 3, 0, std::numeric_limits<int32_t>::min() / 2});
  std::vector<int64_t> l{7, -7, std::numeric_limits<int64_t>::min()};
  divideBy(l.data(), l.size(), DType::kInt64, 3);
  CHECK(l == std::vector<int64_t>{2, -2, std::numeric_limits<int64_t>::min() / 3});
  std::vector<uint8_t> u{255, 1, 9};
  divideBy(u.data(), u.size(), DType::kUInt8, 2);
  CHECK(u == std::vector<uint8_t>{127, 0, 4});
  std::vector<float> f{7, -7, 1};
  divideBy(f.data(), f.size(), DType::kFloat32, 2);
  CHECK(f == std::vector<float>{3.5f, -3.5f, 0.5f});
  std::vector<uint16_t> h{0x3C00, 0x7BFF, 0x0001};  // 1, 65504, smallest subnormal
  divideBy(h.data(), h.size(), DType::kFloat16, 3);
  CHECK(h[0] == encode(1.0 / 3.0, kHalf));
  CHECK(h[1] == encode(65504.0 / 3.0, kHalf));
  CHECK(h[2] == 0x0000);  // 2^-24 / 3 rounds to zero
  uint16_t b = 0x3F80;
  divideBy(&b, 1, DType::kBFloat16, 3);
  CHECK(b == encode(1.0 / 3.0, kBf16));
}

TEST_CASE("divideBy matches the double reference on random data", "[divide]") {
  std::mt19937_64 rng(99);
  const size_t count = 1000003;
  for (int divisor : {1, 3, 8, 7}) {
    INFO("divisor " << divisor);
    auto f = randomFloats<float>(count, rng);
    auto fGot = f;
    divideBy(fGot.data(), count, DType::kFloat32, divisor);
    auto d = randomFloats<double>(count, rng);
    auto dGot = d;
    divideBy(dGot.data(), count, DType::kFloat64, divisor);
    auto h = randomMini(count, kHalf, rng);
    auto hGot = h;
    divideBy(hGot.data(), count, DType::kFloat16, divisor);
    auto b = randomMini(count, kBf16, rng);
    auto bGot = b;
    divideBy(bGot.data(), count, DType::kBFloat16, divisor);
    auto i = randomInts<int32_t>(count, rng);
    auto iGot = i;
    divideBy(iGot.data(), count, DType::kInt32, divisor);
    auto u = randomInts<uint8_t>(count, rng);
    auto uGot = u;
    divideBy(uGot.data(), count, DType::kUInt8, divisor);
    size_t bad = 0;
    for (size_t k = 0; k < count; ++k) {
      bad += !sameFloat(fGot[k], static_cast<float>(static_cast<double>(f[k]) / divisor));
      bad += !sameFloat(dGot[k], d[k] / divisor);
      const uint16_t hWant = encode(decode(h[k], kHalf) / divisor, kHalf);
      bad += isNanBits(hWant, kHalf) ? !isNanBits(hGot[k], kHalf) : hGot[k] != hWant;
      const uint16_t bWant = encode(decode(b[k], kBf16) / divisor, kBf16);
      bad += isNanBits(bWant, kBf16) ? !isNanBits(bGot[k], kBf16) : bGot[k] != bWant;
      bad += iGot[k] != i[k] / divisor;
      bad += uGot[k] != u[k] / divisor;
    }
    CHECK(bad == 0);
  }
}

// Hidden: `runtime_kernel_tests "[.bench]"`. Reports the buffer size over the time (the
// all_reduce's algbw view); memory traffic is three times that (read acc, read in, write acc).
TEST_CASE("reduceInto throughput on 64 MiB float32 and 32 MiB half buffers", "[.bench]") {
  const size_t count = size_t{16} << 20;
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const size_t bytes = count * dtypeSize(dtype);
    // Small values so repeated summing stays finite and away from slow paths.
    std::vector<unsigned char> acc(bytes), in(bytes);
    if (dtype == DType::kFloat32) {
      std::vector<float> ones(count, 1e-3f);
      std::memcpy(acc.data(), ones.data(), bytes);
      std::memcpy(in.data(), ones.data(), bytes);
    } else {
      const uint16_t small = dtype == DType::kFloat16 ? 0x1400 : 0x3A80;  // ~1e-3 in each
      std::vector<uint16_t> v(count, small);
      std::memcpy(acc.data(), v.data(), bytes);
      std::memcpy(in.data(), v.data(), bytes);
    }
    reduceInto(acc.data(), in.data(), count, dtype, ReduceOp::kSum);  // fault the pages in
    double best = 1e9;
    for (int rep = 0; rep < 5; ++rep) {
      const auto start = std::chrono::steady_clock::now();
      reduceInto(acc.data(), in.data(), count, dtype, ReduceOp::kSum);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    const double gbps = static_cast<double>(bytes) / best / 1e9;
    std::printf("reduceInto %-8s sum: %zu elements, %.2f ms, %.2f GB/s of buffer (%.2f GB/s memory traffic)\n",
                std::string(dtypeName(dtype)).c_str(), count, best * 1e3, gbps, 3 * gbps);
    CHECK(gbps > 1.0);
  }
}
