// A model's parameters as bytes, for checking that runs and ranks agree bit for bit: the
// trainers write them with --dump-params and print their FNV-1a digest, and the tests
// compare the files byte for byte.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>

namespace ddprun::trainers {

// Every parameter's raw bytes (CPU, contiguous), in registration order.
std::string parameterBytes(const torch::nn::Module& model);

// 64-bit FNV-1a of `bytes`, as 16 hex digits.
std::string fnv1a64Hex(const std::string& bytes);

// Writes parameterBytes(model) to `dir`/params_rank<rank>.bin (creating `dir`) and
// returns the digest. Throws DdprunError when the file cannot be written.
std::string dumpParameters(const torch::nn::Module& model, const std::string& dir, int rank);

}  // namespace ddprun::trainers
