// rdzv_sim's simulated agents (bench/rdzv_sim.cc): the agents of one client process, each with
// its own DynamicRendezvous and JobBoard, one phase of the job per command byte from the parent,
// and what the two sides tell each other through their pipes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddprun::bench::rdzv_sim {

constexpr int kNprocPerNode = 8;

// CLOCK_MONOTONIC in nanoseconds.
int64_t nowNs();

struct Options {
  int participants = 4096;
  int procs = 0;  // 0: one per kAgentsPerProcess agents, at least 2
  int last_call_s = 2;
  std::string events_dir;  // a temporary directory for the agents' events files
};

// What a client process reports after each phase: a header, then one row per agent.
struct PhaseHeader {
  int32_t agents = 0;
  int32_t errors = 0;
  int64_t end_ns = 0;  // when its last agent finished the phase
  int64_t ops_sum = 0, ops_max = 0, bytes_sum = 0, bytes_max = 0;
  char first_error[200] = {};
};
struct AgentRow {
  int32_t round = -1, group_rank = -1, rank_base = -1, world_size = 0, group_world_size = 0;
  int32_t answers = -1;  // the judge's hang summaries received; -1 for the others
};

// Whole reads and writes on a pipe: writeAll throws std::runtime_error; readAll is false at the
// pipe's end or on an error.
void writeAll(int fd, const void* data, size_t size);
bool readAll(int fd, void* data, size_t size);

// In a client process: agents first .. first + count - 1 of the job whose store listens on
// 127.0.0.1:`port`, each phase read as a byte from `commands` ('q' or the pipe's end: done) and
// reported on `reports` (a PhaseHeader, then an AgentRow per agent). Throws what a pipe or a
// thread throws; an agent's own failure is reported, not thrown.
void serveAgents(const Options& o, int first, int count, int port, int commands, int reports);

}  // namespace ddprun::bench::rdzv_sim
