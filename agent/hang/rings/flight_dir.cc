#include "agent/hang/rings/flight_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

namespace ddprun::agent {

namespace fs = std::filesystem;

FlightDir::FlightDir(const std::string& run_id, const std::string& parent) {
  // The run id comes from the user: only its safe characters go into a file name.
  std::string id;
  for (char c : run_id) id += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_';
  // Not "ddprun-...": that prefix is the shared-memory segments', which tests count as leaks.
  const std::string path = fmt::format("{}/ddprun_flight-{}-{}", parent, id.substr(0, 64), ::getpid());
  if (::mkdir(path.c_str(), 0700) != 0) {
    problem_ = fmt::format("mkdir {}: {}", path, std::strerror(errno));
    return;
  }
  path_ = path;
}

FlightDir::~FlightDir() {
  if (path_.empty()) return;
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::vector<FlightRingSnapshot> FlightDir::read() const {
  std::vector<FlightRingSnapshot> rings;
  if (path_.empty()) return rings;
  std::error_code ec;
  size_t looked = 0;
  for (const auto& entry : fs::directory_iterator(path_, ec)) {
    if (!isFlightRingFileName(entry.path().filename().string())) continue;
    // Workers make the files: a million of them must not make one look take minutes.
    if (++looked > kMaxRingFiles) break;
    if (auto ring = readFlightRingFile(entry.path().string())) rings.push_back(std::move(*ring));
  }
  return rings;
}

void FlightDir::clear() const {
  if (path_.empty()) return;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(path_, ec)) fs::remove(entry.path(), ec);
}

}  // namespace ddprun::agent
