// store_scale's servers (bench/store_scale.cc): a store server in a process of its own, started
// with the descriptor limits asked for, and what /proc says of it and of the network namespace
// during a run.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <string>
#include <utility>

namespace ddprun::bench::store_scale {

// Starts SERVER (which prints "listening on PORT") with the given descriptor limits; returns
// its pid and port. Throws std::runtime_error when it does not say its port within 60 s.
std::pair<pid_t, int> startServer(const std::string& path, rlim_t soft, rlim_t hard);
// Sends `signal` (0: none) and reaps PID, with SIGKILL after `grace_s` seconds.
void killAndReap(pid_t pid, int signal, double grace_s);

// A field of /proc/PID/status in kB, as MiB.
double statusMiB(pid_t pid, const char* field);
// TcpExt ListenOverflows of this network namespace: connections whose SYN was dropped because a
// listener's accept queue was full (each such client retries after 1 s, then 3, 7, ...).
long long listenOverflows();
// User + system CPU seconds of every thread of PID so far.
double cpuSeconds(pid_t pid);

}  // namespace ddprun::bench::store_scale
