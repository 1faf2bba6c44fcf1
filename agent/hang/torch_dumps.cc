#include "agent/hang/torch_dumps.h"

#include <sys/stat.h>

#include <algorithm>

#include <fmt/format.h>

#include "common/env_names.h"

namespace ddprun::agent {

FileStamp stampOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return FileStamp{true, static_cast<uintmax_t>(st.st_size),
                   static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
                   static_cast<uint64_t>(st.st_ino)};
}

std::string torchDumpPrefix(const std::map<std::string, std::string>& env) {
  for (const char* name : {env::kTorchFrDumpTempFile, env::kTorchNcclDebugInfoTempFile}) {
    auto it = env.find(name);
    if (it != env.end() && !it->second.empty()) return it->second;
  }
  return {};
}

TorchDumps::TorchDumps(std::vector<ExpectedDump> expected) {
  std::sort(expected.begin(), expected.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  for (ExpectedDump& e : expected) {
    Slot slot;
    slot.expected = std::move(e);
    slots_.push_back(std::move(slot));
  }
}

std::optional<int> TorchDumps::written() const {
  for (const Slot& s : slots_) {
    if (s.written) return s.expected.rank;
    const FileStamp now = stampOf(s.expected.path);
    if (now.exists && now != s.expected.before) return s.expected.rank;
  }
  return std::nullopt;
}

bool TorchDumps::poll() {
  bool settled = true;
  for (Slot& s : slots_) {
    if (s.dump) continue;
    const FileStamp now = stampOf(s.expected.path);
    if (!s.written) s.written = now.exists && now != s.expected.before;
    if (!s.written) {
      settled = false;
      continue;
    }
    // torch writes the file in place: read it once two looks found the same size.
    const bool holds = s.seen && now.size == s.seen_size;
    s.seen = true;
    s.seen_size = now.size;
    if (!holds || now.size == 0) {
      settled = false;
      continue;
    }
    if (s.tried && s.tried_size == now.size) continue;  // unreadable at this size already
    s.tried = true;
    s.tried_size = now.size;
    s.mtime_ns = now.mtime_ns;
    try {
      s.dump = readFlightDumpFile(s.expected.path, s.expected.rank);
      s.error.clear();
    } catch (const FlightDumpError& e) {
      s.error = e.what();
    }
  }
  return settled;
}

std::vector<int> TorchDumps::writtenRanks() const {
  std::vector<int> ranks;
  for (const Slot& s : slots_) {
    if (s.written) ranks.push_back(s.expected.rank);
  }
  return ranks;
}

std::vector<FlightDump> TorchDumps::dumps() const {
  std::vector<FlightDump> dumps;
  for (const Slot& s : slots_) {
    if (s.dump) dumps.push_back(*s.dump);
  }
  return dumps;
}

std::vector<int> TorchDumps::missing() const {
  std::vector<int> ranks;
  for (const Slot& s : slots_) {
    if (!s.written) ranks.push_back(s.expected.rank);
  }
  return ranks;
}

std::vector<std::string> TorchDumps::unreadable() const {
  std::vector<std::string> lines;
  for (const Slot& s : slots_) {
    if (s.written && !s.dump) {
      lines.push_back(fmt::format("rank {}: {}", s.expected.rank,
                                  s.error.empty() ? s.expected.path + ": still being written" : s.error));
    }
  }
  return lines;
}

int64_t TorchDumps::newestNs() const {
  int64_t newest = 0;
  for (const Slot& s : slots_) {
    if (s.dump) newest = std::max(newest, s.mtime_ns);
  }
  return newest;
}

}  // namespace ddprun::agent
