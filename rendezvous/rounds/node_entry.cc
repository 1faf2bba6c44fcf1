#include "rendezvous/rounds/node_entry.h"

#include <charconv>

#include "common/error.h"

namespace ddprun::rendezvous {

std::string encodeEntry(const NodeEntry& e) { return e.name + "|" + e.address + "|" + std::to_string(e.nproc); }

NodeEntry decodeEntry(const std::string& text) {
  NodeEntry e;
  auto a = text.find('|');
  auto b = text.find('|', a == std::string::npos ? a : a + 1);
  if (a == std::string::npos || b == std::string::npos) throw RendezvousError("malformed node entry '" + text + "'");
  e.name = text.substr(0, a);
  e.address = text.substr(a + 1, b - a - 1);
  const char* first = text.data() + b + 1;
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(first, last, e.nproc);
  if (ec != std::errc() || end != last || e.nproc < 1) throw RendezvousError("malformed node entry '" + text + "'");
  return e;
}

}  // namespace ddprun::rendezvous
