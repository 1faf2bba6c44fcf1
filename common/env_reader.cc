#include "common/env_reader.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include <fmt/format.h>

#include "common/error.h"

namespace ddprun::env {
namespace {

// The value as the message shows it: on one line whatever it holds, and short.
std::string shown(std::string_view text) {
  constexpr size_t kMaxShown = 200;
  std::string out;
  for (char c : text.substr(0, kMaxShown)) {
    const auto byte = static_cast<unsigned char>(c);
    if (std::isprint(byte)) {
      out += c;
    } else {
      out += fmt::format("\\x{:02x}", byte);
    }
  }
  if (text.size() > kMaxShown) out += "...";
  return out;
}

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

}  // namespace

std::optional<std::string> raw(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

std::optional<std::string> optionalString(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::string stringOr(const char* name, std::string_view fallback) {
  auto value = optionalString(name);
  return value ? *value : std::string(fallback);
}

void throwNotSet(const char* name) { throw UsageError(fmt::format("{} is not set", name)); }

std::string requireString(const char* name) {
  auto value = optionalString(name);
  if (!value) throwNotSet(name);
  return *value;
}

int64_t parseInteger(std::string_view name, std::string_view text, int64_t min, int64_t max) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, value);
  // from_chars takes a '-' but no '+' and no spaces, which is what a variable should hold.
  if (text.empty() || stop != end || (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    throw UsageError(fmt::format("{}={}: not an integer", name, shown(text)));
  }
  if (ec == std::errc::result_out_of_range || value < min || value > max) {
    throw UsageError(fmt::format("{}={}: out of range {}..{}", name, shown(text), min, max));
  }
  return value;
}

bool parseBoolean(std::string_view name, std::string_view text) {
  const std::string word = lower(text);
  if (word == "1" || word == "true" || word == "yes" || word == "on") return true;
  if (word == "0" || word == "false" || word == "no" || word == "off") return false;
  throw UsageError(fmt::format("{}={}: not a boolean (1/0, true/false, yes/no, on/off)", name, shown(text)));
}

std::optional<int64_t> optionalInteger(const char* name, int64_t min, int64_t max) {
  auto text = optionalString(name);
  if (!text) return std::nullopt;
  return parseInteger(name, *text, min, max);
}

std::optional<bool> optionalBoolean(const char* name) {
  auto text = optionalString(name);
  if (!text) return std::nullopt;
  return parseBoolean(name, *text);
}

bool booleanOr(const char* name, bool fallback) { return optionalBoolean(name).value_or(fallback); }

}  // namespace ddprun::env
