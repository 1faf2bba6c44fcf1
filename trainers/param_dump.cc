#include "trainers/param_dump.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/error.h"

namespace ddprun::trainers {

std::string parameterBytes(const torch::nn::Module& model) {
  std::string out;
  for (const auto& p : model.parameters()) {
    at::Tensor t = p.detach().to(at::kCPU).contiguous();
    out.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  }
  return out;
}

std::string fnv1a64Hex(const std::string& bytes) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

std::string dumpParameters(const torch::nn::Module& model, const std::string& dir, int rank) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = dir + "/params_rank" + std::to_string(rank) + ".bin";
  const std::string bytes = parameterBytes(model);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw DdprunError("dump parameters: cannot write " + path);
  return fnv1a64Hex(bytes);
}

}  // namespace ddprun::trainers
