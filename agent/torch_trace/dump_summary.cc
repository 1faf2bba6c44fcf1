#include "agent/torch_trace/dump_summary.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "agent/hang/rings/hang_verdict.h"

namespace ddprun::agent {
namespace {

constexpr std::string_view kPrefix = "fr1 ";
// How many entries around its last completed collective a group keeps, from the most to the
// fewest (before, after): the first that fits the budget is sent.
constexpr std::pair<size_t, size_t> kLevels[] = {{8, 8}, {4, 4}, {2, 2}, {0, 1}};

bool plainByte(unsigned char c) { return c > 0x20 && c != 0x7f && c != '%' && c != ','; }

std::string escape(std::string_view s) {
  if (s.empty()) return "-";
  if (s == "-") return "%2D";
  std::string out;
  for (unsigned char c : s) {
    if (plainByte(c)) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

int hexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::optional<std::string> unescape(std::string_view s) {
  if (s == "-") return std::string();
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) return std::nullopt;
    const int hi = hexDigit(s[i + 1]), lo = hexDigit(s[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

template <class T>
bool parseNumber(std::string_view s, T& value) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  return ec == std::errc() && end == s.data() + s.size();
}

std::string summarySizesText(const std::vector<std::vector<int64_t>>& sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    out += i ? ",[" : "[";
    for (size_t j = 0; j < sizes[i].size(); ++j) out += (j ? "," : "") + std::to_string(sizes[i][j]);
    out += "]";
  }
  return out + "]";
}

std::optional<std::vector<std::vector<int64_t>>> parseSizes(std::string_view s) {
  std::vector<std::vector<int64_t>> out;
  if (s.size() < 2 || s.front() != '[' || s.back() != ']') return std::nullopt;
  s = s.substr(1, s.size() - 2);
  while (!s.empty()) {
    if (s.front() != '[') return std::nullopt;
    const size_t close = s.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    std::string_view inner = s.substr(1, close - 1);
    std::vector<int64_t> dims;
    while (!inner.empty()) {
      const size_t comma = inner.find(',');
      int64_t d = 0;
      if (!parseNumber(inner.substr(0, comma), d)) return std::nullopt;
      dims.push_back(d);
      inner = comma == std::string_view::npos ? std::string_view{} : inner.substr(comma + 1);
      if (comma != std::string_view::npos && inner.empty()) return std::nullopt;
    }
    out.push_back(std::move(dims));
    s = s.substr(close + 1);
    if (!s.empty()) {
      if (s.front() != ',' || s.size() == 1) return std::nullopt;
      s = s.substr(1);
    }
  }
  return out;
}

std::string listText(const std::vector<std::string>& items) {
  if (items.empty()) return "-";
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + (items[i] == "-" ? "%2D" : escape(items[i]));
  return out;
}

std::optional<std::vector<std::string>> parseList(std::string_view s) {
  std::vector<std::string> out;
  if (s == "-") return out;
  for (;;) {
    const size_t comma = s.find(',');
    auto item = unescape(s.substr(0, comma));
    if (!item) return std::nullopt;
    out.push_back(std::move(*item));
    if (comma == std::string_view::npos) return out;
    s = s.substr(comma + 1);
  }
}

// "0-7,9" back to its ranks; nullopt when malformed, out of 0..world_size-1, or longer than that.
std::optional<std::vector<int>> parseRanks(std::string_view s, int world_size) {
  std::vector<int> out;
  if (s == "-") return out;
  for (;;) {
    const size_t comma = s.find(',');
    const std::string_view part = s.substr(0, comma);
    const size_t dash = part.find('-');
    int lo = 0, hi = 0;
    if (!parseNumber(part.substr(0, dash), lo)) return std::nullopt;
    hi = lo;
    if (dash != std::string_view::npos && !parseNumber(part.substr(dash + 1), hi)) return std::nullopt;
    if (lo < 0 || hi < lo || hi >= world_size ||
        out.size() + static_cast<size_t>(hi - lo) + 1 > static_cast<size_t>(world_size)) {
      return std::nullopt;
    }
    for (int r = lo; r <= hi; ++r) out.push_back(r);
    if (comma == std::string_view::npos) return out;
    s = s.substr(comma + 1);
  }
}

const char* stateWord(FlightEntryState s) { return flightEntryStateName(s); }

std::optional<FlightEntryState> parseState(std::string_view s) {
  if (s == "scheduled") return FlightEntryState::kScheduled;
  if (s == "started") return FlightEntryState::kStarted;
  if (s == "completed") return FlightEntryState::kCompleted;
  return std::nullopt;
}

std::string optionalNs(const std::optional<int64_t>& t) { return t ? std::to_string(*t) : "-"; }

bool parseOptionalNs(std::string_view s, std::optional<int64_t>& t) {
  if (s == "-") {
    t.reset();
    return true;
  }
  int64_t v = 0;
  if (!parseNumber(s, v)) return false;
  t = v;
  return true;
}

std::string entryLine(int rank, const FlightEntry& e) {
  std::string frame = "- 0 -";
  if (!e.frames.empty()) {
    const FlightFrame& f = e.frames.front();
    frame = fmt::format("{} {} {}", escape(f.filename), f.line, escape(f.name));
  }
  return fmt::format("fr1 e {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}\n", rank, escape(e.pg_name),
                     escape(e.pg_desc), e.collective_seq_id, e.p2p_seq_id, e.is_p2p ? 1 : 0, escape(e.op), e.p2p_src,
                     e.p2p_dst, stateWord(e.state), e.time_created_ns, optionalNs(e.time_started_ns),
                     optionalNs(e.time_completed_ns), e.timeout_ms, summarySizesText(e.input_sizes),
                     listText(e.input_dtypes), summarySizesText(e.output_sizes), listText(e.output_dtypes), frame);
}

std::optional<FlightEntry> parseEntry(const std::vector<std::string_view>& t) {
  // t[0] "fr1", t[1] "e", t[2] rank.
  if (t.size() != 23) return std::nullopt;
  FlightEntry e;
  auto name = unescape(t[3]), desc = unescape(t[4]), op = unescape(t[8]);
  auto state = parseState(t[11]);
  auto in_sizes = parseSizes(t[16]), out_sizes = parseSizes(t[18]);
  auto in_dtypes = parseList(t[17]), out_dtypes = parseList(t[19]);
  auto file = unescape(t[20]), function = unescape(t[22]);
  int is_p2p = 0;
  FlightFrame frame;
  if (!name || !desc || !op || !state || !in_sizes || !out_sizes || !in_dtypes || !out_dtypes || !file || !function ||
      !parseNumber(t[5], e.collective_seq_id) || !parseNumber(t[6], e.p2p_seq_id) || !parseNumber(t[7], is_p2p) ||
      (is_p2p != 0 && is_p2p != 1) || !parseNumber(t[9], e.p2p_src) || !parseNumber(t[10], e.p2p_dst) ||
      !parseNumber(t[12], e.time_created_ns) || !parseOptionalNs(t[13], e.time_started_ns) ||
      !parseOptionalNs(t[14], e.time_completed_ns) || !parseNumber(t[15], e.timeout_ms) ||
      !parseNumber(t[21], frame.line)) {
    return std::nullopt;
  }
  e.pg_name = std::move(*name);
  e.pg_desc = std::move(*desc);
  e.op = std::move(*op);
  e.profiling_name = e.op;
  e.is_p2p = is_p2p == 1;
  e.state = *state;
  e.input_sizes = std::move(*in_sizes);
  e.output_sizes = std::move(*out_sizes);
  e.input_dtypes = std::move(*in_dtypes);
  e.output_dtypes = std::move(*out_dtypes);
  frame.filename = std::move(*file);
  frame.name = std::move(*function);
  if (!frame.filename.empty() || !frame.name.empty()) e.frames.push_back(std::move(frame));
  return e;
}

std::vector<std::string_view> tokens(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    const size_t start = i;
    while (i < line.size() && line[i] != ' ') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

// One rank's lines; its group lines only for the groups `sent` does not hold yet.
std::string rankLines(const LocalDump& d, std::set<std::tuple<std::string, std::string, std::vector<int>>>& sent) {
  std::string out =
      fmt::format("fr1 d {} {} {} {}\n", d.dump.rank, d.local_rank, d.dump.truncated ? 1 : 0, d.finished ? 1 : 0);
  for (const FlightGroupConfig& g : d.dump.groups) {
    if (!sent.emplace(g.name, g.desc, g.ranks).second) continue;
    out += fmt::format("fr1 g {} {} {} {}\n", d.dump.rank, escape(g.name), escape(g.desc),
                       g.ranks.empty() ? "-" : rankRanges(g.ranks));
  }
  for (const FlightEntry& e : d.dump.entries) out += entryLine(d.dump.rank, e);
  return out;
}

}  // namespace

bool isDumpSummaryLine(std::string_view line) { return line.substr(0, kPrefix.size()) == kPrefix; }

std::string escapeSummaryText(std::string_view text) { return escape(text); }

std::optional<std::string> unescapeSummaryText(std::string_view token) { return unescape(token); }

FlightDump compactDump(const FlightDump& dump, size_t before, size_t after) {
  std::map<std::string, std::vector<size_t>> by_group;  // indices into entries, in order
  for (size_t i = 0; i < dump.entries.size(); ++i) by_group[dump.entries[i].pg_name].push_back(i);
  std::vector<bool> keep(dump.entries.size(), false);
  for (const auto& [name, indices] : by_group) {
    size_t anchor = 0;
    for (size_t k = 0; k < indices.size(); ++k) {
      const FlightEntry& e = dump.entries[indices[k]];
      if (!e.is_p2p && e.state == FlightEntryState::kCompleted) anchor = k;
    }
    const size_t from = anchor >= before ? anchor - before : 0;
    const size_t to = std::min(indices.size() - 1, anchor + after);
    for (size_t k = from; k <= to; ++k) keep[indices[k]] = true;
  }
  if (!keep.empty()) keep.back() = true;  // the newest entry: where a rank behind last was

  FlightDump out;
  out.rank = dump.rank;
  out.version = dump.version;
  out.truncated = dump.truncated;
  std::set<std::string> named;
  for (size_t i = 0; i < dump.entries.size(); ++i) {
    if (!keep[i]) {
      out.truncated = true;
      continue;
    }
    FlightEntry e = dump.entries[i];
    e.frames.clear();
    if (auto site = callSite(dump.entries[i].frames)) e.frames.push_back(std::move(*site));
    e.record_id = static_cast<int64_t>(out.entries.size());
    named.insert(e.pg_name);
    out.entries.push_back(std::move(e));
  }
  for (const FlightGroupConfig& g : dump.groups) {
    if (named.count(g.name)) out.groups.push_back(g);
  }
  return out;
}

namespace {

// The innermost kMaxStackLines lines of each sent rank's traceback, within `max_bytes`.
std::string stackLines(const std::vector<LocalDump>& sorted, const std::string& sent, size_t max_bytes) {
  std::string out;
  for (const LocalDump& d : sorted) {
    if (d.python_stack.empty() || sent.find(fmt::format("fr1 d {} ", d.dump.rank)) == std::string::npos) continue;
    std::vector<std::string_view> lines;
    for (std::string_view rest = d.python_stack; !rest.empty();) {
      const size_t newline = rest.find('\n');
      lines.push_back(rest.substr(0, newline));
      rest = newline == std::string_view::npos ? std::string_view{} : rest.substr(newline + 1);
    }
    const size_t from = lines.size() > kMaxStackLines ? lines.size() - kMaxStackLines : 0;
    std::string mine;
    for (size_t i = from; i < lines.size(); ++i) mine += fmt::format("fr1 s {} {}\n", d.dump.rank, escape(lines[i]));
    if (out.size() + mine.size() > max_bytes) continue;
    out += mine;
  }
  return out;
}

}  // namespace

std::string encodeDumpSummary(const std::string& node, const std::vector<LocalDump>& dumps, size_t max_bytes,
                              size_t max_stack_bytes) {
  const std::string head = fmt::format("fr1 n {}\n", escape(node));
  std::vector<LocalDump> sorted = dumps;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.dump.rank < b.dump.rank; });
  std::string out;
  for (size_t level = 0; level < std::size(kLevels); ++level) {
    const auto [before, after] = kLevels[level];
    const bool last = level + 1 == std::size(kLevels);
    out = head;
    std::set<std::tuple<std::string, std::string, std::vector<int>>> sent;
    bool fits = true;
    for (const LocalDump& d : sorted) {
      LocalDump compact{compactDump(d.dump, before, after), d.local_rank, d.finished, {}};
      auto sent_before = sent;
      const std::string lines = rankLines(compact, sent);
      if (out.size() + lines.size() > max_bytes) {
        fits = false;
        if (!last) break;
        sent = std::move(sent_before);  // the fewest entries: the ranks that fit go, the rest are left out
        continue;
      }
      out += lines;
    }
    if (fits || last) return out + stackLines(sorted, out, max_stack_bytes);
  }
  return out;
}

RemoteDumps decodeDumpSummary(std::string_view summary, int world_size, const std::vector<int>& local_ranks) {
  RemoteDumps out;
  std::string node;
  std::map<int, FlightDump> dumps;
  std::set<int> bad;  // ranks sent twice or out of range: all their lines go
  while (!summary.empty()) {
    const size_t newline = summary.find('\n');
    const std::string_view line = summary.substr(0, newline);
    summary = newline == std::string_view::npos ? std::string_view{} : summary.substr(newline + 1);
    if (!isDumpSummaryLine(line)) continue;
    const std::vector<std::string_view> t = tokens(line);
    if (t.size() < 3 || t[1].size() != 1) {
      ++out.rejected;
      continue;
    }
    const char kind = t[1][0];
    if (kind == 'n') {
      auto name = t.size() == 3 ? unescape(t[2]) : std::nullopt;
      if (name) {
        node = std::move(*name);
      } else {
        ++out.rejected;
      }
      continue;
    }
    int rank = -1;
    const bool fits = parseNumber(t[2], rank) && rank >= 0 && rank < world_size &&
                      std::find(local_ranks.begin(), local_ranks.end(), rank) == local_ranks.end() && !bad.count(rank);
    if (!fits) {
      ++out.rejected;
      continue;
    }
    if (kind == 'd') {
      int local_rank = 0, truncated = 0, finished = 0;
      if (t.size() != 6 || !parseNumber(t[3], local_rank) || local_rank < 0 || !parseNumber(t[4], truncated) ||
          !parseNumber(t[5], finished) || dumps.count(rank)) {
        ++out.rejected;
        if (dumps.erase(rank)) bad.insert(rank);
        continue;
      }
      FlightDump& d = dumps[rank];
      d.rank = rank;
      d.truncated = truncated != 0;
      out.ranks[rank] = RemoteRank{node, local_rank};
      if (finished) out.finished_ranks.push_back(rank);
      continue;
    }
    auto it = dumps.find(rank);
    if (it == dumps.end()) {
      ++out.rejected;
      continue;
    }
    if (kind == 'g') {
      auto name = t.size() == 6 ? unescape(t[3]) : std::nullopt;
      auto desc = t.size() == 6 ? unescape(t[4]) : std::nullopt;
      auto ranks = t.size() == 6 ? parseRanks(t[5], world_size) : std::nullopt;
      if (!name || !desc || !ranks) {
        ++out.rejected;
        continue;
      }
      it->second.groups.push_back(FlightGroupConfig{std::move(*name), std::move(*desc), std::move(*ranks)});
    } else if (kind == 's') {
      // One line of its traceback: the rest of the line after the rank, as one token.
      auto text = t.size() == 4 ? unescape(t[3]) : std::nullopt;
      std::string& stack = out.python_stacks[rank];
      if (!text || static_cast<size_t>(std::count(stack.begin(), stack.end(), '\n')) >= kMaxStackLines) {
        ++out.rejected;
        if (stack.empty()) out.python_stacks.erase(rank);
        continue;
      }
      stack += *text + "\n";
    } else if (kind == 'e') {
      auto e = parseEntry(t);
      if (!e) {
        ++out.rejected;
        continue;
      }
      e->record_id = static_cast<int64_t>(it->second.entries.size());
      it->second.entries.push_back(std::move(*e));
    } else {
      ++out.rejected;
    }
  }
  for (auto& [rank, d] : dumps) out.dumps.push_back(std::move(d));
  for (int r : bad) {
    out.ranks.erase(r);
    out.python_stacks.erase(r);
  }
  std::erase_if(out.finished_ranks, [&](int r) { return bad.count(r) > 0; });
  return out;
}

}  // namespace ddprun::agent
