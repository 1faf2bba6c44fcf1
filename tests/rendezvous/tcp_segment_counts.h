// Segment counters of a connected TCP socket, from the kernel's TCP_INFO. Kept apart from
// the other helpers because <linux/tcp.h> and <netinet/tcp.h> cannot share a file.
#pragma once

#include <cstdint>

namespace ddprun::rendezvous::testing {

struct SegmentCounts {
  uint64_t received = 0;       // every segment that arrived, pure acknowledgements included
  uint64_t received_data = 0;  // those that carried data
};

// Throws std::runtime_error when the socket cannot report them.
SegmentCounts segmentCounts(int fd);

}  // namespace ddprun::rendezvous::testing
