// torch's flight-recorder dumps of this node's ranks, gathered when a collective fails: each
// rank's file `<prefix><global rank>` (the prefix from TORCH_FR_DUMP_TEMP_FILE or
// TORCH_NCCL_DEBUG_INFO_TEMP_FILE in the worker's environment), told apart from a file that
// was already there when the worker started (a prefix the user set may hold an older job's
// dumps), read once its size holds still between two looks (torch writes it in place), and
// parsed with agent/torch_trace/ on a thread of its own, so that a dump, whatever it
// holds, never stalls the agent's event loop (its signals, its workers' output): the reader
// is bounded in memory (PickleLimits: some times the file's size) and time (linear), and a
// read in flight is cancelled when the TorchDumps is destroyed. The agent looks (poll) from
// its event loop, a bounded few seconds, and then judges with dumpVerdict when every rank's
// dump was read.
//
// Not thread-safe: one thread calls it (its reading thread is its own); poll and the
// accessors make file-system stats only and never wait for a read.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/torch_trace/flight_dump.h"

namespace ddprun::agent {

// A file as stat saw it: a dump counts when it differs from what was there before.
struct FileStamp {
  bool exists = false;
  uintmax_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t inode = 0;
  bool operator==(const FileStamp&) const = default;
};
FileStamp stampOf(const std::string& path);

// The dump prefix torch uses in `env` (TORCH_FR_DUMP_TEMP_FILE first, as torch 2.7+ reads
// it, else TORCH_NCCL_DEBUG_INFO_TEMP_FILE); empty when neither is set: torch's default,
// /tmp/nccl_trace_rank_, is shared by every job on the host and not read.
std::string torchDumpPrefix(const std::map<std::string, std::string>& env);

struct ExpectedDump {
  int rank = 0;
  std::string path;
  FileStamp before;  // when the worker started
};

// How a dump is read: readFlightDumpFile, or a test's stand-in. Called on the reading thread;
// it throws FlightDumpError for a dump that cannot be read, and stops soon once
// limits.cancel is set.
using DumpReader = std::function<FlightDump(const std::string& path, int rank, const PickleLimits& limits)>;

class TorchDumps {
 public:
  explicit TorchDumps(std::vector<ExpectedDump> expected, DumpReader reader = readFlightDumpFile);
  // Cancels the read in flight, if any, and joins the reading thread: within milliseconds,
  // whatever the dump holds.
  ~TorchDumps();
  TorchDumps(const TorchDumps&) = delete;
  TorchDumps& operator=(const TorchDumps&) = delete;

  // A rank whose dump was written since its worker started; nullopt when none. One stat per rank.
  std::optional<int> written() const;

  // Looks once: takes the reads that finished, and hands each written dump whose size did not
  // change since the previous look to the reading thread (read in order, one at a time).
  // Returns true when every rank's dump was read or found unreadable (at a size that held).
  // Never waits for a read; never throws beyond std::bad_alloc.
  bool poll();
  // Waits until no read is in flight, at most `limit`, and takes the reads that finished;
  // returns whether none is left in flight. For tests, and for a caller with nothing else to do.
  bool waitForReads(std::chrono::milliseconds limit);

  // The ranks whose dump was written (read or not), ascending.
  std::vector<int> writtenRanks() const;
  // The dumps read, by rank.
  std::vector<FlightDump> dumps() const;
  // The ranks without a written dump, ascending.
  std::vector<int> missing() const;
  // "rank 1: <why>" for each dump that could not be read (or is still being written, or read);
  // empty when none.
  std::vector<std::string> unreadable() const;
  // The newest modification time of the dumps read (CLOCK_REALTIME ns), 0 when none: when
  // the waiting stopped, for the verdict's "has waited in it for".
  int64_t newestNs() const;

 private:
  struct Slot {
    ExpectedDump expected;
    bool written = false;
    uintmax_t seen_size = 0;   // at the previous look
    bool seen = false;         // looked at once since it was written
    uintmax_t tried_size = 0;  // the size last parsed
    bool tried = false;
    bool reading = false;  // handed to the reading thread, not yet back
    std::optional<FlightDump> dump;
    std::string error;
    int64_t mtime_ns = 0;
  };
  class Reads;  // the reading thread and what goes to it and back (torch_dumps.cc)
  void take();  // the finished reads, into their slots

  std::vector<Slot> slots_;
  DumpReader reader_;
  std::unique_ptr<Reads> reads_;  // started with the first read
};

}  // namespace ddprun::agent
