#include "agent/hang/python/stack_summary.h"

#include <algorithm>
#include <charconv>
#include <set>

#include <fmt/format.h>

namespace ddprun::agent {
namespace {

constexpr std::string_view kPrefix = "py1 ";

std::vector<std::string_view> splitOn(std::string_view text, char separator) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    const size_t at = text.find(separator);
    out.push_back(text.substr(0, at));
    text = at == std::string_view::npos ? std::string_view{} : text.substr(at + 1);
  }
  return out;
}

bool parseInt(std::string_view s, int& value) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

bool isStackSummaryLine(std::string_view line) { return line.substr(0, kPrefix.size()) == kPrefix; }

std::string encodeStackSummary(const std::string& node, const std::vector<LocalStack>& stacks, size_t max_bytes) {
  std::string out;
  for (const LocalStack& s : stacks) {
    if (s.traceback.empty()) continue;
    std::vector<std::string_view> lines = splitOn(s.traceback, '\n');
    // Its innermost lines: where the rank stands.
    const size_t from = lines.size() > kMaxStackLines ? lines.size() - kMaxStackLines : 0;
    std::string mine = fmt::format("py1 r {} {} {}\n", s.rank, s.local_rank, escapeSummaryText(node));
    for (size_t i = from; i < lines.size(); ++i) {
      mine += fmt::format("py1 s {} {}\n", s.rank, escapeSummaryText(lines[i]));
    }
    if (out.size() + mine.size() > max_bytes) continue;
    out += mine;
  }
  return out;
}

RemoteStacks decodeStackSummary(std::string_view summary, int world_size, const std::vector<int>& local_ranks) {
  RemoteStacks out;
  std::set<int> bad;  // ranks sent twice, out of range or too long: all their lines go
  std::map<int, size_t> lines_of;
  for (std::string_view line : splitOn(summary, '\n')) {
    if (!isStackSummaryLine(line)) continue;
    const std::vector<std::string_view> t = splitOn(line, ' ');
    int rank = -1;
    if (t.size() < 4 || t[1].size() != 1 || !parseInt(t[2], rank) || rank < 0 || rank >= world_size ||
        std::find(local_ranks.begin(), local_ranks.end(), rank) != local_ranks.end()) {
      ++out.rejected;
      continue;
    }
    if (t[1] == "r") {
      int local_rank = -1;
      auto node = t.size() == 5 ? unescapeSummaryText(t[4]) : std::nullopt;
      if (!node || !parseInt(t[3], local_rank) || local_rank < 0 || out.ranks.count(rank)) {
        bad.insert(rank);
        ++out.rejected;
        continue;
      }
      out.ranks[rank] = RemoteStack{std::move(*node), local_rank, {}};
    } else if (t[1] == "s") {
      auto text = t.size() == 4 ? unescapeSummaryText(t[3]) : std::nullopt;
      auto it = out.ranks.find(rank);
      if (!text || it == out.ranks.end() || ++lines_of[rank] > kMaxStackLines) {
        bad.insert(rank);
        ++out.rejected;
        continue;
      }
      it->second.traceback += *text + "\n";
    } else {
      ++out.rejected;
    }
  }
  for (int rank : bad) out.ranks.erase(rank);
  return out;
}

}  // namespace ddprun::agent
