// Which addresses belong to this host: decides whether this agent hosts the store of a
// c10d rendezvous (its endpoint names this host).
#pragma once

#include <string>

namespace ddprun::rendezvous {

// True for "localhost", loopback literals, and any address of a local interface.
// Host names other than localhost are resolved (once; getaddrinfo).
bool isLocalAddress(const std::string& host);

// Splits "host[:port]" / "[v6]:port"; `port` keeps `default_port` when none is given.
// Throws UsageError naming the endpoint when the port is not a number in 0..65535.
void splitHostPort(const std::string& endpoint, std::string& host, int& port, int default_port);

}  // namespace ddprun::rendezvous
