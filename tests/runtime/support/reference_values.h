// Inputs and expected results of the collective tests, computed here without the code under
// test (no reduceInto, no dtype.cc conversions). Every input is a function of (rank, index,
// salt), so each rank knows every rank's input. Values are small integers, chosen per
// operator so that every partial sum, product, minimum and maximum is exact in every dtype
// (float16 and bfloat16 included): results do not depend on the order of reduction, and are
// compared exactly. AVG rounds once, to nearest even, as the runtime promises.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "worker_runtime/collectives/dtype.h"

namespace ddprun::testing {

using runtime::DType;
using runtime::ReduceOp;

inline const std::vector<DType> kAllDTypes = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                                              DType::kInt32,   DType::kInt64,   DType::kUInt8};
inline const std::vector<ReduceOp> kAllReduceOps = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
                                                    ReduceOp::kAvg};

// The element size, written out here rather than taken from the runtime.
size_t elementBytes(DType dtype);

// What `rank` contributes at `index` for `op`.
int64_t inputValue(ReduceOp op, DType dtype, int rank, size_t index, int salt);

// The reduction of every rank's input at `index` over `world_size` ranks, as the dtype holds
// it (AVG rounded or truncated, uint8 products wrapped).
double expectedValue(ReduceOp op, DType dtype, int world_size, size_t index, int salt);

// Element `i` of `buf` as a double; and `value` written there, rounded to nearest even (the
// values used here are exact except AVG's quotients).
double loadElement(const void* buf, size_t i, DType dtype);
void storeElement(void* buf, size_t i, DType dtype, double value);

// `count` elements of rank `rank`'s input from index `first` on, as bytes of `dtype`.
std::vector<uint8_t> inputBuffer(ReduceOp op, DType dtype, int rank, size_t count, int salt, size_t first = 0);

// Throws std::runtime_error naming `what`, the first wrong element, got and expected, unless
// element i of `got` equals expectedValue(op, dtype, world_size, first + i, salt) for i < count.
void checkReduced(const std::string& what, const void* got, size_t count, ReduceOp op, DType dtype, int world_size,
                  int salt, size_t first = 0);

// Byte `index` of the block that rank `from` holds for `to` (opaque data for the collectives
// that only move bytes); `to` is -1 for a block meant for everyone.
uint8_t patternByte(int from, int to, size_t index, int salt);
std::vector<uint8_t> patternBlock(int from, int to, size_t bytes, int salt);

// Throws std::runtime_error naming `what` and the first differing byte unless the `bytes` at
// `got` are patternBlock(from, to, bytes, salt).
void checkPattern(const std::string& what, const uint8_t* got, size_t bytes, int from, int to, int salt);

}  // namespace ddprun::testing
