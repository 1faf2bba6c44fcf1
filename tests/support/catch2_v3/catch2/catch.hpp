// Catch2 v2's single header, for the tests built against Catch2 v3 (Debian 13 ships 3.x,
// Debian 12 ships 2.13). The tests are written once against v2's names; this header is on
// the include path only when CMake finds Catch2 3, and maps the few names v3 moved:
// Approx left the global namespace, and the string matchers live in Catch::Matchers, with
// Contains renamed to ContainsSubstring (v3's Contains matches range elements).
#pragma once

#include <catch2/catch_all.hpp>
#include <string>

namespace Catch {
inline Matchers::StringContainsMatcher Contains(const std::string& text) { return Matchers::ContainsSubstring(text); }
using Matchers::EndsWith;
using Matchers::Equals;
using Matchers::Matches;
using Matchers::Message;
using Matchers::StartsWith;
}  // namespace Catch

using Catch::Approx;
