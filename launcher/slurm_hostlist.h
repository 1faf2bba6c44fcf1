// SLURM host lists ("n[01-04],gpu[1,3]-ib") expanded to host names, natively: ddprun
// --slurm and `ddprun hostnames` must work on clusters where `scontrol` is not on the
// compute nodes' PATH. The grammar is SLURM's (hostlist.c), with suffixes after any bracket:
//   list   := entry ((',' | whitespace) entry)*
//   entry  := (text | '[' ranges ']')+      several brackets: the cartesian product,
//                                           the leftmost bracket varying slowest
//   ranges := range (',' range)*
//   range  := NUM | NUM '-' NUM             LOW <= HIGH, decimal digits only
// A range is zero-padded to the width of its low bound as written ([08-12] -> 08..12,
// [001-5] -> 001..005, [9-10] -> 9, 10). Order and duplicates are kept as written.
// Stricter than scontrol where it guesses: ",,", "n[1-" and "n[1-]" are errors here.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

// A list expanding to more hosts than this is refused (a typo like [1-99999999] would
// otherwise exhaust memory before anything reports it).
inline constexpr size_t kMaxHostlistHosts = size_t{1} << 20;

// Expands `text` into host names, in order, duplicates kept. Pure; thread-safe. Throws
// UsageError "invalid host list '<text>': <what and where>" (positions are 1-based) for
// an empty list, an empty entry (",,", a leading or trailing ','), an unclosed, nested or
// stray bracket, an empty range, a non-decimal or descending range, or a list expanding
// to more than kMaxHostlistHosts names.
std::vector<std::string> expandHostlist(std::string_view text);

}  // namespace ddprun::launcher
