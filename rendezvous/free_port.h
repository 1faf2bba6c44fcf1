// Finding a TCP port that is free right now on a local address.
#pragma once

#include <string>

namespace ddprun::rendezvous {

// Binds port 0 on `host` (an IPv4/IPv6 literal or "localhost"), reads the port the
// kernel chose and releases it. Does not block. Throws SystemError when no socket can
// be bound. The port can be taken by someone else before it is used; callers that
// can, keep the socket instead (the store does, in the rendezvous issue).
int findFreePort(const std::string& host = "127.0.0.1");

}  // namespace ddprun::rendezvous
