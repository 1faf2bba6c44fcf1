#include "tests/rendezvous/tcp_segment_counts.h"

#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ddprun::rendezvous::testing {

SegmentCounts segmentCounts(int fd) {
  tcp_info info{};
  socklen_t length = sizeof info;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) {
    throw std::runtime_error(std::string("getsockopt(TCP_INFO): ") + std::strerror(errno));
  }
  return {info.tcpi_segs_in, info.tcpi_data_segs_in};
}

}  // namespace ddprun::rendezvous::testing
