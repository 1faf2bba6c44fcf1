// Strict number parsing for flag values, with torchrun-style error messages.
#pragma once

#include <string_view>

namespace ddprun::launcher {

// Parses all of `text` as an integer in [min, max]. Throws UsageError
// "invalid <flag> value '<text>': expected <expected>".
int parseInt(std::string_view flag, std::string_view text, int min, int max, std::string_view expected);

// Parses all of `text` as a number of seconds in [0, kMaxDurationSeconds] (fractions allowed).
double parseSeconds(std::string_view flag, std::string_view text);

}  // namespace ddprun::launcher
