// store_scale's clients (bench/store_scale.cc): client processes, each an epoll loop over its
// share of non-blocking sockets, each socket a client running torch's TCPStore start-up sequence
// in the wire of one generation, bound to its own source address in 127.0.0.0/8.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <string>

namespace ddprun::bench::store_scale {

// The store's wire: torch 2.x's (VALIDATE first) or torch 1.13's.
enum class Wire { kCurrent, kLegacy };
const char* wireName(Wire wire);

// CLOCK_MONOTONIC in nanoseconds: the clock of every deadline and time of store_scale.
int64_t nowNs();

// Clients that share one source address.
constexpr int kClientsPerAddress = 64;
// Source address of client `rank`: 127.1.0.1 upwards, skipping .0 and .255 last bytes.
in_addr_t sourceAddress(int rank);
std::string addressText(in_addr_t address);

// What one client process reports to the parent through a pipe.
struct ClientReport {
  int32_t released = 0;  // clients whose GET of their peer's key was answered with its value
  int32_t wrong = 0;     // ... answered with something else
  int32_t failed = 0;    // connect or I/O failures, closed connections
  int32_t unfinished = 0;
  int64_t last_release_ns = 0;
  int64_t last_connect_ns = 0;  // when the last connection was established
  int64_t last_add_ns = 0;      // when the last ADD was answered
  char first_error[160] = {};
};

// Runs clients first_rank .. first_rank + count - 1 of `world` against the store on
// 127.0.0.1:`port` until each is released or `deadline_ns` (nowNs()) passes.
ClientReport runClients(int first_rank, int count, int world, int port, Wire wire, int64_t deadline_ns);

}  // namespace ddprun::bench::store_scale
