// One participant's entry in a round, "<node name>|<address>|<nproc>" under the round's
// node/<seat> key (rendezvous/PROTOCOL.md): written as a node joins, read by the rounds
// (dynamic_rendezvous.cc) and their watcher (round_watch.cc). Private to rendezvous/rounds/.
#pragma once

#include <string>

namespace ddprun::rendezvous {

struct NodeEntry {
  std::string name;
  std::string address;
  int nproc = 0;
};

std::string encodeEntry(const NodeEntry& e);
// Throws RendezvousError on a malformed entry.
NodeEntry decodeEntry(const std::string& text);

}  // namespace ddprun::rendezvous
