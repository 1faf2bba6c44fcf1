#include "launcher/parse_number.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "common/durations.h"
#include "common/error.h"

namespace ddprun::launcher {
namespace {

UsageError invalid(std::string_view flag, std::string_view text, std::string_view expected) {
  return UsageError("invalid " + std::string(flag) + " value '" + std::string(text) + "': expected " +
                    std::string(expected));
}

}  // namespace

int parseInt(std::string_view flag, std::string_view text, int min, int max, std::string_view expected) {
  long long value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < min || value > max) {
    throw invalid(flag, text, expected);
  }
  return static_cast<int>(value);
}

double parseSeconds(std::string_view flag, std::string_view text) {
  std::string copy(text);
  char* end = nullptr;
  double value = std::strtod(copy.c_str(), &end);
  if (copy.empty() || end != copy.c_str() + copy.size() || !std::isfinite(value) || value < 0 ||
      value > kMaxDurationSeconds) {
    throw invalid(flag, text, fmt::format("a number of seconds from 0 to {:.0f}", kMaxDurationSeconds));
  }
  return value;
}

}  // namespace ddprun::launcher
