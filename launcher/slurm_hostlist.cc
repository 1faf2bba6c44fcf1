#include "launcher/slurm_hostlist.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdint>

#include "common/error.h"

namespace ddprun::launcher {
namespace {

// uint64 holds 19 decimal digits; 18 keeps HIGH - LOW + 1 from overflowing.
constexpr size_t kMaxDigits = 18;

[[noreturn]] void fail(std::string_view text, const std::string& why) {
  throw UsageError(fmt::format("invalid host list '{}': {}", text, why));
}

bool isSpace(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// Brackets first, over the whole text, so that every later step may assume they pair up.
void checkBrackets(std::string_view text) {
  size_t open = std::string_view::npos;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '[') {
      if (open != std::string_view::npos) {
        fail(text, fmt::format("'[' at position {} inside the bracket opened at position {}", i + 1, open + 1));
      }
      open = i;
    } else if (text[i] == ']') {
      if (open == std::string_view::npos) fail(text, fmt::format("']' at position {} without a '['", i + 1));
      open = std::string_view::npos;
    }
  }
  if (open != std::string_view::npos) fail(text, fmt::format("'[' at position {} is never closed", open + 1));
}

uint64_t parseNumber(std::string_view text, std::string_view range, std::string_view digits, size_t pos) {
  if (digits.size() > kMaxDigits) {
    fail(text, fmt::format("range '{}' at position {} has a number of more than {} digits", range, pos, kMaxDigits));
  }
  if (digits.empty()) {
    fail(text, fmt::format("range '{}' at position {} is not N or LOW-HIGH "
                           "with decimal numbers",
                           range, pos));
  }
  uint64_t value = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') {
      fail(text, fmt::format("range '{}' at position {} is not N or LOW-HIGH "
                             "with decimal numbers",
                             range, pos));
    }
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  return value;
}

// The values one bracket stands for; `begin` is the offset of its first
// character after '[' in `text`, for the messages.
std::vector<std::string> expandBracket(std::string_view text, std::string_view body, size_t begin) {
  std::vector<std::string> values;
  size_t offset = 0;
  while (true) {
    size_t comma = body.find(',', offset);
    std::string_view range =
        body.substr(offset, comma == std::string_view::npos ? std::string_view::npos : comma - offset);
    size_t pos = begin + offset + 1;
    if (range.empty()) fail(text, fmt::format("empty range at position {}", pos));
    size_t dash = range.find('-');
    std::string_view low_text = range.substr(0, dash);
    std::string_view high_text = dash == std::string_view::npos ? low_text : range.substr(dash + 1);
    uint64_t low = parseNumber(text, range, low_text, pos);
    uint64_t high = parseNumber(text, range, high_text, pos);
    if (low > high) fail(text, fmt::format("range '{}' at position {} goes down ({} > {})", range, pos, low, high));
    if (high - low + 1 > kMaxHostlistHosts - values.size()) {
      fail(text, fmt::format("expands to more than {} hosts", kMaxHostlistHosts));
    }
    // SLURM pads to the width of the low bound as written, so [08-12] keeps its
    // zero and [9-10] does not gain one.
    for (uint64_t n = low; n <= high; ++n) values.push_back(fmt::format("{:0{}}", n, low_text.size()));
    if (comma == std::string_view::npos) break;
    offset = comma + 1;
  }
  return values;
}

// One entry ("rack[1-2]-n[01-02]"), starting at offset `begin` of `text`,
// appended to `hosts` as the cartesian product of its pieces, leftmost piece varying slowest.
void expandEntry(std::string_view text, std::string_view entry, size_t begin, std::vector<std::string>& hosts) {
  std::vector<std::string> product{""};
  size_t i = 0;
  while (i < entry.size()) {
    std::vector<std::string> piece;
    if (entry[i] == '[') {
      size_t close = entry.find(']', i);
      piece = expandBracket(text, entry.substr(i + 1, close - i - 1), begin + i + 1);
      i = close + 1;
    } else {
      size_t open = entry.find('[', i);
      piece.emplace_back(entry.substr(i, open == std::string_view::npos ? std::string_view::npos : open - i));
      i = open == std::string_view::npos ? entry.size() : open;
    }
    if (piece.size() > 1 && product.size() > (kMaxHostlistHosts - hosts.size()) / piece.size()) {
      fail(text, fmt::format("expands to more than {} hosts", kMaxHostlistHosts));
    }
    std::vector<std::string> next;
    next.reserve(product.size() * piece.size());
    for (const auto& head : product) {
      for (const auto& tail : piece) next.push_back(head + tail);
    }
    product = std::move(next);
  }
  if (hosts.size() + product.size() > kMaxHostlistHosts) {
    fail(text, fmt::format("expands to more than {} hosts", kMaxHostlistHosts));
  }
  for (auto& host : product) hosts.push_back(std::move(host));
}

}  // namespace

std::vector<std::string> expandHostlist(std::string_view text) {
  checkBrackets(text);
  std::vector<std::string> hosts;
  // Top-level commas separate entries and must each have one on both sides;
  // whitespace separates too (SLURM accepts "n1 n2") but may repeat freely.
  size_t item_begin = 0;
  while (true) {
    size_t comma = item_begin;
    for (int depth = 0; comma < text.size(); ++comma) {
      if (text[comma] == '[') ++depth;
      if (text[comma] == ']') --depth;
      if (text[comma] == ',' && depth == 0) break;
    }
    size_t item_end = comma;
    bool has_entry = false;
    for (size_t i = item_begin; i < item_end;) {
      if (isSpace(text[i])) {
        ++i;
        continue;
      }
      size_t j = i;
      for (int depth = 0; j < item_end && (depth > 0 || !isSpace(text[j])); ++j) {
        if (text[j] == '[') ++depth;
        if (text[j] == ']') --depth;
      }
      expandEntry(text, text.substr(i, j - i), i, hosts);
      has_entry = true;
      i = j;
    }
    if (!has_entry) {
      if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) fail(text, "no host names");
      fail(text, comma < text.size() ? fmt::format("empty entry before the ',' at position {}", comma + 1)
                                     : fmt::format("empty entry after the ',' at position {}", item_begin));
    }
    if (comma >= text.size()) break;
    item_begin = comma + 1;
  }
  return hosts;
}

}  // namespace ddprun::launcher
