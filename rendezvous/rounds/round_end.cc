#include "rendezvous/rounds/round_end.h"

namespace ddprun::rendezvous {
namespace {

struct KindName {
  RoundEnd::Kind kind;
  std::string_view prefix;  // with its ':'
};
constexpr KindName kPrefixes[] = {
    {RoundEnd::Kind::kFail, "fail:"}, {RoundEnd::Kind::kFinal, "final:"}, {RoundEnd::Kind::kAbort, "abort:"},
    {RoundEnd::Kind::kJoin, "join:"}, {RoundEnd::Kind::kEvict, "evict:"},
};
constexpr std::string_view kDone = "done";

}  // namespace

std::string RoundEnd::format() const {
  if (kind == Kind::kDone) return std::string(kDone);
  for (const auto& [k, prefix] : kPrefixes) {
    if (k != kind) continue;
    std::string text = std::string(prefix) + node;
    if (kind == Kind::kAbort) text += ":" + signal;
    return text;
  }
  return std::string(kDone);  // unreachable: every kind is in the table
}

std::optional<RoundEnd> RoundEnd::parse(std::string_view text) {
  if (text == kDone) return done();
  for (const auto& [kind, prefix] : kPrefixes) {
    if (!text.starts_with(prefix)) continue;
    std::string_view rest = text.substr(prefix.size());
    if (kind != Kind::kAbort) {
      if (rest.empty()) return std::nullopt;
      return RoundEnd{kind, std::string(rest), {}};
    }
    // A node's name holds ':' (host:pid); a signal's name does not: it follows the last one.
    const size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == rest.size()) return std::nullopt;
    return RoundEnd{kind, std::string(rest.substr(0, colon)), std::string(rest.substr(colon + 1))};
  }
  return std::nullopt;
}

}  // namespace ddprun::rendezvous
