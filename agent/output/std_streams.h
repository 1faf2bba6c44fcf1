// torchrun's --redirects / --tee values: "0".."3" for every local rank, or a per-rank
// map "0:1,1:2" (ranks not named get 0). 0 none, 1 stdout, 2 stderr, 3 both.
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace ddprun::agent {

enum class Std : int { kNone = 0, kOut = 1, kErr = 2, kAll = 3 };

inline bool includesStdout(Std s) { return s == Std::kOut || s == Std::kAll; }
inline bool includesStderr(Std s) { return s == Std::kErr || s == Std::kAll; }

class StdSpec {
 public:
  StdSpec() = default;
  explicit StdSpec(Std all) : all_(all) {}

  // Parses torchrun's syntax. Throws UsageError naming `flag` and the bad text.
  static StdSpec parse(std::string_view flag, std::string_view text);

  Std forLocalRank(int local_rank) const;
  bool anyStream() const;

 private:
  Std all_ = Std::kNone;
  std::map<int, Std> per_rank_;
};

}  // namespace ddprun::agent
