// The one typed reader of environment variables for every layer: a variable read as a
// string, an integer within bounds, or a boolean, required or with a fallback. A malformed
// value throws UsageError with one line that names the variable and its value
// (`RANK=abc: not an integer`, `MASTER_PORT=99999: out of range 1..65535`), so a worker
// started with a bad environment fails at once instead of running as rank 0 or waiting out
// a timeout. Names come from common/env_names.h.
//
// An empty value counts as unset everywhere (`FOO= cmd` is how shells clear a setting);
// only raw() tells the two apart, for variables where empty means something
// (CUDA_VISIBLE_DEVICES= hides every GPU).
//
// Every function reads the process environment: thread-safe as long as nobody calls setenv.
#pragma once

#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun::env {

// The value as it is, empty included; nullopt when unset. Never throws.
std::optional<std::string> raw(const char* name);

// The value; nullopt when unset or empty. Never throws.
std::optional<std::string> optionalString(const char* name);
// The value, or `fallback` when unset or empty. Never throws.
std::string stringOr(const char* name, std::string_view fallback);
// The value. Throws UsageError ("NAME is not set") when unset or empty.
std::string requireString(const char* name);

// `text` as a decimal integer (an optional '-', then digits; nothing else, no spaces) within
// [min, max]. Throws UsageError "NAME=text: not an integer" or "NAME=text: out of range min..max".
int64_t parseInteger(std::string_view name, std::string_view text, int64_t min, int64_t max);
// `text` as a boolean: 1/0, true/false, yes/no, on/off, in any case. Throws UsageError
// "NAME=text: not a boolean (...)" otherwise.
bool parseBoolean(std::string_view name, std::string_view text);

// The variable as an integer in [min, max]; nullopt when unset or empty. Throws UsageError
// when it is set to anything else.
std::optional<int64_t> optionalInteger(const char* name, int64_t min, int64_t max);
// The variable as a boolean; nullopt when unset or empty. Throws UsageError when malformed.
std::optional<bool> optionalBoolean(const char* name);
// The variable as a boolean, or `fallback` when unset or empty. Throws UsageError when malformed.
bool booleanOr(const char* name, bool fallback);

// The integer readers for any integer type whose range fits int64_t; the bounds default to
// the type's range, so the result always fits. `fallback` is not checked against the bounds.

// The variable as an integer in [min, max]. Throws UsageError when unset, empty or malformed.
template <std::integral T>
T requireInteger(const char* name, T min = std::numeric_limits<T>::min(), T max = std::numeric_limits<T>::max());
// The variable as an integer in [min, max], or `fallback` when unset or empty. Throws
// UsageError when it is set to anything else.
template <std::integral T>
T integerOr(const char* name, T fallback, T min = std::numeric_limits<T>::min(), T max = std::numeric_limits<T>::max());

// ---- implementation ----

[[noreturn]] void throwNotSet(const char* name);

template <std::integral T>
T requireInteger(const char* name, T min, T max) {
  static_assert(std::numeric_limits<T>::max() <= std::numeric_limits<int64_t>::max(), "the range must fit int64_t");
  const auto value = optionalInteger(name, static_cast<int64_t>(min), static_cast<int64_t>(max));
  if (!value) throwNotSet(name);
  return static_cast<T>(*value);
}

template <std::integral T>
T integerOr(const char* name, T fallback, T min, T max) {
  static_assert(std::numeric_limits<T>::max() <= std::numeric_limits<int64_t>::max(), "the range must fit int64_t");
  const auto value = optionalInteger(name, static_cast<int64_t>(min), static_cast<int64_t>(max));
  return value ? static_cast<T>(*value) : fallback;
}

}  // namespace ddprun::env
