#include "agent/hang/rings/progress_summary.h"

#include <charconv>
#include <cmath>
#include <set>
#include <utility>

#include <fmt/format.h>

namespace ddprun::agent {
namespace {

// A wait or a median beyond this (microseconds: about 11.5 days) is no real one.
constexpr int64_t kMaxWaitUs = int64_t{1000000} * 1000000;
constexpr int64_t kMaxThresholdMs = int64_t{10000000} * 1000;

std::vector<std::string_view> tokens(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size() && out.size() <= 16) {
    while (i < line.size() && line[i] == ' ') ++i;
    const size_t start = i;
    while (i < line.size() && line[i] != ' ') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

template <typename T>
bool parse(std::string_view token, T& value, T lo, T hi) {
  const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  return ec == std::errc() && end == token.data() + token.size() && value >= lo && value <= hi;
}

int64_t toMicros(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return 0;
  return static_cast<int64_t>(std::min<double>(seconds * 1e6, static_cast<double>(kMaxWaitUs)));
}

// Calls `each` with every line of `text` (the last one may lack its newline).
template <typename F>
void forLines(std::string_view text, F each) {
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    each(text.substr(0, newline));
    text = newline == std::string_view::npos ? std::string_view{} : text.substr(newline + 1);
  }
}

}  // namespace

std::string encodeNodeProgress(const NodeProgress& progress) {
  std::string out = fmt::format("dp1 {} {}\n", progress.unix_ms,
                                static_cast<int64_t>(std::llround(std::max(0.0, progress.threshold_s) * 1000)));
  auto append = [&](const std::string& line) {
    if (out.size() + line.size() + 1 > kMaxProgressBytes) return;
    out += line;
    out += '\n';
  };
  size_t n = 0;
  for (const RankProgress& p : progress.ranks) {
    if (n++ == kMaxProgressEntries) break;
    append(
        fmt::format("s {} {} {} {} {}", p.rank, p.group, p.last_completed_seq, p.collectives, toMicros(p.mean_wait_s)));
  }
  n = 0;
  for (const RankPosition& p : progress.positions) {
    if (p.kind != FlightRingKind::kCollective) continue;
    if (n++ == kMaxProgressEntries) break;
    append(encodePosition(p));
  }
  n = 0;
  for (const TracePosition& p : progress.traces) {
    if (n++ == kMaxProgressEntries) break;
    append(encodeTracePosition(p));
  }
  return out;
}

std::optional<DecodedProgress> decodeNodeProgress(std::string_view text, int world_size) {
  if (text.size() > kMaxProgressBytes) return std::nullopt;
  const size_t newline = text.find('\n');
  const auto head = tokens(text.substr(0, newline));
  DecodedProgress out;
  int64_t threshold_ms = 0;
  if (head.size() != 3 || head[0] != "dp1" || !parse<int64_t>(head[1], out.progress.unix_ms, 0, INT64_MAX / 2) ||
      !parse<int64_t>(head[2], threshold_ms, 0, kMaxThresholdMs)) {
    return std::nullopt;
  }
  out.progress.threshold_s = static_cast<double>(threshold_ms) / 1000;
  if (newline == std::string_view::npos) return out;
  std::set<std::pair<int, int>> seen_progress;
  std::set<std::pair<int, int>> seen_positions;
  std::set<std::pair<int, int>> seen_traces;
  forLines(text.substr(newline + 1), [&](std::string_view line) {
    if (line.empty()) return;
    const auto t = tokens(line);
    if (t.size() == 6 && t[0] == "s") {
      RankProgress p;
      int64_t wait_us = 0;
      const bool ok = parse<int>(t[1], p.rank, 0, world_size - 1) && parse<int>(t[2], p.group, 0, INT32_MAX) &&
                      parse<uint64_t>(t[3], p.last_completed_seq, 0, UINT64_MAX) &&
                      parse<uint32_t>(t[4], p.collectives, 1, static_cast<uint32_t>(kStragglerWindow)) &&
                      parse<int64_t>(t[5], wait_us, 0, kMaxWaitUs);
      if (ok && out.progress.ranks.size() < kMaxProgressEntries && seen_progress.emplace(p.rank, p.group).second) {
        p.mean_wait_s = static_cast<double>(wait_us) / 1e6;
        out.progress.ranks.push_back(p);
      } else {
        ++out.rejected;
      }
      return;
    }
    if (line.starts_with("t ")) {
      const std::optional<TracePosition> p = decodeTracePosition(line);
      if (p && p->rank < world_size && out.progress.traces.size() < kMaxProgressEntries &&
          seen_traces.emplace(p->rank, p->group).second) {
        out.progress.traces.push_back(*p);
      } else {
        ++out.rejected;
      }
      return;
    }
    // A position (hang_verdict.h checks its form); collectives only, within the world.
    const std::optional<RankPosition> p = decodePosition(std::string(line));
    const bool ok = p && p->kind == FlightRingKind::kCollective && p->rank >= 0 && p->rank < world_size &&
                    p->group_rank >= 0 && p->group_rank < world_size && p->group >= 0 &&
                    out.progress.positions.size() < kMaxProgressEntries &&
                    seen_positions.emplace(p->rank, p->group).second;
    if (ok) {
      out.progress.positions.push_back(*p);
    } else {
      ++out.rejected;
    }
  });
  return out;
}

std::string encodeJobMedians(const JobMedians& medians) {
  std::string out = fmt::format("dm1 {}\n", medians.unix_ms);
  size_t n = 0;
  for (const GroupMedian& m : medians.groups) {
    if (n++ == kMaxMedianGroups) break;
    out += fmt::format("m {} {} {}\n", m.group, toMicros(m.median_wait_s), m.ranks);
  }
  return out;
}

std::optional<JobMedians> decodeJobMedians(std::string_view text) {
  if (text.size() > kMaxMediansBytes) return std::nullopt;
  const size_t newline = text.find('\n');
  const auto head = tokens(text.substr(0, newline));
  JobMedians out;
  if (head.size() != 2 || head[0] != "dm1" || !parse<int64_t>(head[1], out.unix_ms, 0, INT64_MAX / 2)) {
    return std::nullopt;
  }
  if (newline == std::string_view::npos) return out;
  std::set<int> seen;
  forLines(text.substr(newline + 1), [&](std::string_view line) {
    const auto t = tokens(line);
    GroupMedian m;
    int64_t median_us = 0;
    if (t.size() == 4 && t[0] == "m" && parse<int>(t[1], m.group, 0, INT32_MAX) &&
        parse<int64_t>(t[2], median_us, 0, kMaxWaitUs) && parse<uint32_t>(t[3], m.ranks, 2, UINT32_MAX) &&
        out.groups.size() < kMaxMedianGroups && seen.insert(m.group).second) {
      m.median_wait_s = static_cast<double>(median_us) / 1e6;
      out.groups.push_back(m);
    }
  });
  return out;
}

}  // namespace ddprun::agent
