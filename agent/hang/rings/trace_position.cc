#include "agent/hang/rings/trace_position.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <vector>

#include <fmt/format.h>

namespace ddprun::agent {
namespace {

// An age beyond this (milliseconds: about 11.5 days) is no real one.
constexpr int64_t kMaxAgeMs = int64_t{1000000} * 1000;

bool opChar(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }

template <typename T>
bool parseTraceField(std::string_view token, T& value, T lo, T hi) {
  const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  return ec == std::errc() && end == token.data() + token.size() && value >= lo && value <= hi;
}

std::optional<TraceState> stateOf(std::string_view word) {
  for (TraceState s : {TraceState::kPending, TraceState::kStarted, TraceState::kFailed, TraceState::kCompleted}) {
    if (word == traceStateName(s)) return s;
  }
  return std::nullopt;
}

}  // namespace

const char* traceStateName(TraceState state) {
  switch (state) {
    case TraceState::kPending: return "pending";
    case TraceState::kStarted: return "started";
    case TraceState::kFailed: return "failed";
    case TraceState::kCompleted: return "completed";
  }
  return "pending";
}

std::string traceOpName(std::string_view raw) {
  std::string out(raw.substr(0, kMaxTraceOpChars));
  std::replace_if(
      out.begin(), out.end(), [](char c) { return !opChar(c); }, '_');
  return out.empty() ? "unknown" : out;
}

std::string encodeTracePosition(const TracePosition& p) {
  const double age_ms = std::isfinite(p.age_s) ? std::clamp(p.age_s * 1000, 0.0, static_cast<double>(kMaxAgeMs)) : 0;
  return fmt::format("t {} {} {} {} {} {}", p.rank, p.group, p.seq, traceOpName(p.op), traceStateName(p.state),
                     static_cast<int64_t>(std::llround(age_ms)));
}

std::optional<TracePosition> decodeTracePosition(std::string_view line) {
  std::vector<std::string_view> t;
  size_t i = 0;
  while (i < line.size() && t.size() <= 7) {
    while (i < line.size() && line[i] == ' ') ++i;
    const size_t start = i;
    while (i < line.size() && line[i] != ' ') ++i;
    if (i > start) t.push_back(line.substr(start, i - start));
  }
  if (t.size() != 7 || t[0] != "t") return std::nullopt;
  TracePosition p;
  int64_t age_ms = 0;
  const auto state = stateOf(t[5]);
  const bool op_ok = t[4].size() <= kMaxTraceOpChars && std::all_of(t[4].begin(), t[4].end(), opChar);
  if (!parseTraceField<int>(t[1], p.rank, 0, INT32_MAX) || !parseTraceField<int>(t[2], p.group, 0, INT32_MAX) ||
      !parseTraceField<uint64_t>(t[3], p.seq, 0, UINT64_MAX) || !op_ok || !state ||
      !parseTraceField<int64_t>(t[6], age_ms, 0, kMaxAgeMs)) {
    return std::nullopt;
  }
  p.op = std::string(t[4]);
  p.state = *state;
  p.age_s = static_cast<double>(age_ms) / 1000;
  return p;
}

}  // namespace ddprun::agent
