// Keep-alives of a running round kept by the store itself, where it has them (etcd's
// leases; PROTOCOL.md: "etcd"), instead of the rendezvous' own keep-alive counters. For
// as long as the object lives, this node's `own_key` exists (on a lease it keeps alive),
// and when the successor's key disappears (its lease lapsed: the node is gone) or never
// appears, the round ends with `evict_reason` (a compare-and-set of `end_key`, so an end
// already written stands). Dropping the object stops the keep-alives without deleting the
// key: the lease then lapses on its own, after the round has ended.
#pragma once

#include <chrono>
#include <string>

namespace ddprun::rendezvous {

struct RoundLivenessSpec {
  std::string own_key;         // store keys, as the rendezvous names them
  std::string successor_key;   // empty: a round of one node
  std::string successor_name;  // for the log line
  std::string end_key;
  std::string evict_reason;                             // RoundEnd::evict(successor).format()
  std::chrono::milliseconds ttl{15000};                 // how long a silent node stays in
  std::chrono::milliseconds keep_alive_interval{5000};  // how often this node says it is alive
};

class RoundLiveness {
 public:
  virtual ~RoundLiveness() = default;
};

}  // namespace ddprun::rendezvous
