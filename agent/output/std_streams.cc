#include "agent/output/std_streams.h"

#include <charconv>

#include "common/error.h"

namespace ddprun::agent {
namespace {

bool parseInt(std::string_view text, int& out) {
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

bool parseStd(std::string_view text, Std& out) {
  int value = -1;
  if (!parseInt(text, value) || value < 0 || value > 3) return false;
  out = static_cast<Std>(value);
  return true;
}

}  // namespace

StdSpec StdSpec::parse(std::string_view flag, std::string_view text) {
  auto bad = [&](std::string_view why) {
    return UsageError("invalid " + std::string(flag) + " value '" + std::string(text) + "': " + std::string(why) +
                      " (expected 0-3, or a map like 0:1,1:3)");
  };
  StdSpec spec;
  if (text.find(':') == std::string_view::npos) {
    if (!parseStd(text, spec.all_)) throw bad("not a stream number");
    return spec;
  }
  std::string_view rest = text;
  while (!rest.empty()) {
    auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (comma != std::string_view::npos && rest.empty()) throw bad("trailing comma");
    auto colon = item.find(':');
    int rank = -1;
    Std value;
    if (colon == std::string_view::npos || !parseInt(item.substr(0, colon), rank) || rank < 0 ||
        !parseStd(item.substr(colon + 1), value)) {
      throw bad("bad entry '" + std::string(item) + "'");
    }
    if (!spec.per_rank_.emplace(rank, value).second) {
      throw bad("local rank " + std::to_string(rank) + " given twice");
    }
  }
  return spec;
}

Std StdSpec::forLocalRank(int local_rank) const {
  if (per_rank_.empty()) return all_;
  auto it = per_rank_.find(local_rank);
  return it == per_rank_.end() ? Std::kNone : it->second;
}

bool StdSpec::anyStream() const {
  if (all_ != Std::kNone) return true;
  for (const auto& [rank, value] : per_rank_) {
    if (value != Std::kNone) return true;
  }
  return false;
}

}  // namespace ddprun::agent
