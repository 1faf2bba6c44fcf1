// torch's flight-recorder dumps of this node's ranks, gathered when a collective fails: each
// rank's file `<prefix><global rank>` (the prefix from TORCH_FR_DUMP_TEMP_FILE or
// TORCH_NCCL_DEBUG_INFO_TEMP_FILE in the worker's environment), told apart from a file that
// was already there when the worker started (a prefix the user set may hold an older job's
// dumps), read once its size holds still between two looks (torch writes it in place), and
// parsed with agent/hang/torch_trace/. The agent looks (poll) from its event loop, a bounded few
// seconds, and then judges with dumpVerdict when every rank's dump was read.
//
// Not thread-safe; file-system reads only (stat, and reading a dump of at most
// PickleLimits' size).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent/hang/torch_trace/flight_dump.h"

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

class TorchDumps {
 public:
  explicit TorchDumps(std::vector<ExpectedDump> expected);

  // A rank whose dump was written since its worker started; nullopt when none. One stat per rank.
  std::optional<int> written() const;

  // Looks once: reads each written dump whose size did not change since the previous look.
  // Returns true when every rank's dump was read or found unreadable (at a size that held).
  // Never throws beyond std::bad_alloc.
  bool poll();

  // The ranks whose dump was written (read or not), ascending.
  std::vector<int> writtenRanks() const;
  // The dumps read, by rank.
  std::vector<FlightDump> dumps() const;
  // The ranks without a written dump, ascending.
  std::vector<int> missing() const;
  // "rank 1: <why>" for each dump that could not be read; empty when none.
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
    std::optional<FlightDump> dump;
    std::string error;
    int64_t mtime_ns = 0;
  };
  std::vector<Slot> slots_;
};

}  // namespace ddprun::agent
