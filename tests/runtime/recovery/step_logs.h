// The chaos trainer's step logs (tests/chaos/chaos_trainer.cc) read back by the in-job
// recovery tests: each rank's steps with their parameter hashes and wall-clock times.
#pragma once

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <utility>
#include <vector>

namespace ddprun::testing::recovery {

// Each rank's step log read back: step -> parameter hash, and what looked wrong.
struct RankLog {
  std::map<int, std::string> sums;
  std::vector<std::string> problems;
  int starts = 0;
  bool done = false;
  std::vector<std::pair<int, long long>> step_times;  // step, wall clock ms
};

inline RankLog readRank(const std::string& dir, int rank) {
  static const std::regex kStep(R"(^step .* step=(\d+) sum=([0-9a-f]+) t=(\d+))");
  RankLog log;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("steps.", 0) != 0 || name.substr(name.rfind('.') + 1) != std::to_string(rank)) continue;
    std::ifstream in(entry.path());
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (line.rfind("start ", 0) == 0) ++log.starts;
      if (line.rfind("done ", 0) == 0) log.done = true;
      if (!std::regex_search(line, m, kStep)) continue;
      const int step = std::stoi(m[1]);
      if (log.sums.count(step)) log.problems.push_back("step " + m[1].str() + " applied twice");
      log.sums[step] = m[2];
      log.step_times.emplace_back(step, std::stoll(m[3]));
    }
  }
  return log;
}

inline int lastStep(const std::string& dir, int rank) {
  const RankLog log = readRank(dir, rank);
  return log.sums.empty() ? 0 : log.sums.rbegin()->first;
}

inline long long nowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Wall-clock ms from `killed_at` to the first step a survivor logged after it.
inline long long firstStepAfter(const std::string& dir, int survivor, long long killed_at) {
  for (const auto& [step, t] : readRank(dir, survivor).step_times) {
    if (t > killed_at) return t - killed_at;
  }
  return -1;
}

}  // namespace ddprun::testing::recovery
