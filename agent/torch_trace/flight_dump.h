// One rank's torch flight-recorder dump as plain data: what torch's NCCL (or gloo, from
// torch 2.8) process groups wrote to `<prefix><rank>` when a collective timed out. The file
// is a pickle (torch's C++ pickler, protocol 2, or Python's pickle.dump of the same dict)
// with the keys `version`, `pg_config` (per group: name, desc, ranks), `pg_status` and
// `entries`, one per operation, oldest first: `record_id`, `pg_id`, `process_group`
// (name, desc), `collective_seq_id`, `p2p_seq_id`, `op_id`, `profiling_name`
// ("nccl:all_reduce", "nccl:send 0->1"), `input_sizes`, `input_dtypes`, `output_sizes`,
// `output_dtypes`, `state` ("scheduled", "started", "completed"), `time_created_ns`,
// `time_discovered_started_ns`, `time_discovered_completed_ns`, `timeout_ms`, `is_p2p` and
// `frames` (name, filename, line; innermost first). torch 2.2 through 2.11 wrote these
// under the same names; the fields that came later (dtypes, is_p2p, p2p_seq_id, timeout_ms)
// are optional here, and torch's own analyzer (torch.distributed.flight_recorder) reads
// the same keys. No Python and no LibTorch: agent/torch_trace/pickle_reader.h reads the
// pickle.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/torch_trace/pickle_reader.h"
#include "common/error.h"

namespace ddprun::agent {

// A dump that cannot be used: not a pickle, truncated, or without the keys and types of a
// flight-recorder dump. The message names the file and what was wrong.
class FlightDumpError : public DdprunError {
 public:
  using DdprunError::DdprunError;
};

struct FlightFrame {
  std::string name;      // the function
  std::string filename;  // as Python or the symbolizer gave it
  int64_t line = 0;
};

// An entry's frames, innermost first: an immutable list shared by the entries whose frames are
// the same (a call site's entries; in torch's pickle they are the same memoized strings), so
// that a dump costs its distinct stacks once, not once per entry. Reads as a const vector;
// push_back and clear copy it first when it is shared.
class FlightFrames {
 public:
  FlightFrames() = default;
  FlightFrames(std::vector<FlightFrame> frames)  // NOLINT: implicit, as the vector it replaces
      : frames_(std::make_shared<const std::vector<FlightFrame>>(std::move(frames))) {}
  FlightFrames(std::initializer_list<FlightFrame> frames) : FlightFrames(std::vector<FlightFrame>(frames)) {}

  const std::vector<FlightFrame>& get() const;
  operator const std::vector<FlightFrame>&() const { return get(); }  // NOLINT: callSite(e.frames)
  size_t size() const { return get().size(); }
  bool empty() const { return get().empty(); }
  const FlightFrame& operator[](size_t i) const { return get()[i]; }
  const FlightFrame& front() const { return get().front(); }
  std::vector<FlightFrame>::const_iterator begin() const { return get().begin(); }
  std::vector<FlightFrame>::const_iterator end() const { return get().end(); }
  void push_back(FlightFrame frame);
  void clear() { frames_.reset(); }
  // Whether `other` is the same list (shared), not merely equal.
  bool sharedWith(const FlightFrames& other) const { return frames_ && frames_ == other.frames_; }

 private:
  std::shared_ptr<const std::vector<FlightFrame>> frames_;
};

enum class FlightEntryState { kScheduled, kStarted, kCompleted };
const char* flightEntryStateName(FlightEntryState state);  // "scheduled", "started", "completed"
// The state a dump names (flightEntryStateName's words, as torch writes them); nullopt for any other.
std::optional<FlightEntryState> parseFlightEntryState(std::string_view name);

struct FlightEntry {
  int64_t record_id = 0;  // 0 for the first operation since the recorder started
  int64_t pg_id = -1;
  std::string pg_name;  // process_group[0]: "0" for the default group
  std::string pg_desc;  // process_group[1]: "default_pg", "undefined" when none was given
  int64_t collective_seq_id = 0;
  int64_t p2p_seq_id = 0;
  int64_t op_id = 0;
  std::string profiling_name;  // "nccl:all_reduce", "nccl:send 0->1"
  std::string op;              // the operation alone: "all_reduce", "send", "coalesced"
  bool is_p2p = false;         // `is_p2p`, or (older dumps) a send or recv
  // For send and recv, the two ends in ranks of the group (profiling_name "send 0->1",
  // "recv 1<-0"); -1 for others.
  int p2p_src = -1;
  int p2p_dst = -1;
  std::vector<std::vector<int64_t>> input_sizes;
  std::vector<std::vector<int64_t>> output_sizes;
  std::vector<std::string> input_dtypes;  // "Float", "Int"...
  std::vector<std::string> output_dtypes;
  FlightEntryState state = FlightEntryState::kScheduled;
  int64_t time_created_ns = 0;  // CLOCK_REALTIME of the rank's host
  std::optional<int64_t> time_started_ns;
  std::optional<int64_t> time_completed_ns;
  int64_t timeout_ms = 0;  // 0: not recorded
  FlightFrames frames;     // innermost first
};

struct FlightGroupConfig {
  std::string name;  // the key of pg_config, as entries name it in process_group[0]
  std::string desc;
  std::vector<int> ranks;  // global ranks, ascending: group rank i is ranks[i]
};

struct FlightDump {
  int rank = -1;  // the global rank, from the file's name (the content does not say)
  std::string version;
  std::vector<FlightGroupConfig> groups;
  std::vector<FlightEntry> entries;  // oldest first
  // True when the ring buffer had overwritten older operations (the first entry's record_id
  // is not 0): counts from the start of the job are then unknown.
  bool truncated = false;
};

// Sets e.op (and e.p2p_src, e.p2p_dst) from e.profiling_name: "nccl:send 0->1" -> op "send",
// src 0, dst 1; "nccl:recv 1<-0" -> op "recv", dst 1, src 0; "gloo:all_reduce" -> "all_reduce".
void parseProfilingName(FlightEntry& e);

// The dump in `bytes`. `what` names it in errors (the file's path). Throws FlightDumpError
// ("what: ...") for a bad pickle or a value of the wrong type under a known key; unknown
// keys are ignored. Pure.
FlightDump parseFlightDump(std::string_view bytes, const std::string& what, const PickleLimits& limits = {});

// The dump in the file at `path` for `rank`. Throws FlightDumpError when it cannot be read
// (not a regular file, too large, I/O) or parsed. Blocks for the read only.
FlightDump readFlightDumpFile(const std::string& path, int rank, const PickleLimits& limits = {});

// The frame that shows where the user's code called the operation: the innermost one outside
// torch itself (its distributed package and wrappers) and outside Python's own machinery;
// the innermost of all when every frame is torch's. nullopt without frames.
std::optional<FlightFrame> callSite(const std::vector<FlightFrame>& frames);

}  // namespace ddprun::agent
