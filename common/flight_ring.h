// The flight recorder's ring: the last N operations of one process group of one worker,
// in memory that the agent can read without the worker's help (a file under the
// directory the agent names in DDPRUN_FLIGHT_DIR, normally on /dev/shm), even while the
// worker is stuck or stopped. This one header is the format for both sides: the worker's
// runtime writes (FlightRingWriter), the agent reads (readFlightRing).
//
// A group keeps two rings: one for its collectives and one for its point-to-point messages
// (send, recv), each with its own sequence numbers, so that messages, which ranks exchange
// in patterns of their own, never shift the collective numbers the hang verdict compares
// across ranks. The header's flags word says which kind a ring is; it was a reserved word,
// always zero, in rings written before there were two kinds, which therefore read as
// collective rings (the version did not change, so older readers still read collective rings).
//
// Layout: a FlightRingHeader, then `capacity` FlightEntry slots of 64 bytes; operation
// `seq` (1, 2, ...) lives in slot (seq - 1) % capacity. Every field is a 64-bit word
// accessed atomically, so a reader in another process (or thread) never sees a torn word.
// Each slot is a seqlock: its `version` is odd while the writer changes it; a reader
// copies the slot and keeps the copy only when `version` was even and unchanged around the
// copy. A slot being rewritten is skipped, never waited for: the writer may be stopped.
//
// Timestamps are CLOCK_MONOTONIC nanoseconds (std::chrono::steady_clock on Linux), which
// every process of one host shares; other hosts see ages, never raw timestamps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun {

inline constexpr uint64_t kFlightRingMagic = 0x3130524644505444ull;  // "DTPDFR01" little-endian
inline constexpr uint32_t kFlightRingVersion = 1;
inline constexpr uint32_t kFlightRingDefaultCapacity = 256;
// The most slots a reader accepts (256 KiB a ring; writers use 256): a worker writes the
// header, and a claimed capacity of 2^32 slots must not make the agent read 256 GiB.
inline constexpr uint32_t kFlightRingMaxCapacity = 4096;

enum class FlightOp : uint8_t {
  kUnknown,
  kBroadcast,
  kAllReduce,
  kReduce,
  kAllGather,
  kGather,
  kScatter,
  kReduceScatter,
  kAllToAll,
  kBarrier,
  kSend,
  kRecv
};
// Codes of runtime::DType plus one for operations without a data type (barrier, byte moves).
enum class FlightDType : uint8_t { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8, kNone = 255 };
enum class FlightState : uint8_t { kEnqueued, kStarted, kCompleted, kFailed };
// What a ring records: a group's collectives, or its point-to-point messages.
enum class FlightRingKind : uint8_t { kCollective, kPointToPoint };
// FlightRingHeader::flags: the ring records point-to-point messages.
inline constexpr uint64_t kFlightRingFlagPointToPoint = 1;

// torch's names: "all_reduce", "send", "float32", "started".
std::string_view flightOpName(FlightOp op);
std::string_view flightDTypeName(FlightDType dtype);
std::string_view flightStateName(FlightState state);
// Bytes of one element of `dtype` (1 for kNone, whose count is bytes).
size_t flightDTypeBytes(FlightDType dtype);

// What the writer records about one operation when it is enqueued.
struct FlightOpInfo {
  FlightOp op = FlightOp::kUnknown;
  FlightDType dtype = FlightDType::kNone;
  uint64_t count = 0;  // elements (bytes when dtype is kNone)
  // Group rank of the root (broadcast, reduce, gather, scatter) or of the peer (send: the
  // destination, recv: the source); -1: none.
  int32_t root = -1;
};

// One operation as read back.
struct FlightRecord {
  uint64_t seq = 0;
  FlightOpInfo info;
  FlightState state = FlightState::kEnqueued;
  int64_t enqueued_ns = 0;
  int64_t started_ns = 0;  // 0 until started
  int64_t ended_ns = 0;    // 0 until completed or failed
};

struct alignas(64) FlightRingHeader {
  uint64_t magic;
  uint64_t version_capacity;  // version << 32 | capacity
  uint64_t rank;              // the worker's global rank
  uint64_t group;             // 0: the default group; k: the k-th new_group
  uint64_t group_rank_size;   // group rank << 32 | group size
  uint64_t pid;
  uint64_t last_seq;  // the newest operation enqueued (0: none); written last, after its slot
  uint64_t flags;     // kFlightRingFlagPointToPoint or 0 (collectives); other bits are 0
};

struct alignas(64) FlightEntry {
  uint64_t version;  // seqlock: odd while being written
  uint64_t seq;
  uint64_t meta;  // op | dtype << 8 | state << 16 | (uint32 root) << 32
  uint64_t count;
  uint64_t enqueued_ns;
  uint64_t started_ns;
  uint64_t ended_ns;
  uint64_t reserved;
};

static_assert(sizeof(FlightRingHeader) == 64 && sizeof(FlightEntry) == 64);

// Bytes of a ring of `capacity` slots.
constexpr size_t flightRingBytes(uint32_t capacity) {
  return sizeof(FlightRingHeader) + size_t{capacity} * sizeof(FlightEntry);
}

// Writes a ring laid over caller-owned memory (a mapping of the ring's file, or plain
// memory when nobody reads it). Not thread-safe: one writer at a time, as the caller
// serialises (the host backend writes under its queue's lock). Never blocks, never throws.
class FlightRingWriter {
 public:
  FlightRingWriter() = default;
  // Initialises the header at `memory` (flightRingBytes(capacity) bytes, zeroed, 64-aligned).
  FlightRingWriter(void* memory, uint32_t capacity, int rank, int group, int group_rank, int group_size,
                   FlightRingKind kind = FlightRingKind::kCollective);

  // Records a new operation as enqueued at `now_ns`; returns its sequence number.
  uint64_t enqueue(const FlightOpInfo& info, int64_t now_ns);
  // enqueue() and start() at once: one write of the slot (an op that runs as it is issued).
  uint64_t enqueueStarted(const FlightOpInfo& info, int64_t now_ns);
  // Moves operation `seq` on; a no-op when its slot has since been reused (the ring wrapped).
  void start(uint64_t seq, int64_t now_ns);
  void finish(uint64_t seq, bool ok, int64_t now_ns);

 private:
  FlightEntry* slot(uint64_t seq) const;
  // A new record in `state` (kEnqueued, or kStarted as well) at `now_ns`; its sequence number.
  uint64_t append(const FlightOpInfo& info, FlightState state, int64_t now_ns);
  void write(FlightEntry* e, const FlightRecord& r);
  void update(FlightEntry* e, const FlightRecord& r, uint64_t FlightEntry::*stamp, int64_t now_ns);

  FlightRingHeader* header_ = nullptr;
  FlightEntry* entries_ = nullptr;
  uint32_t capacity_ = 0;
  uint64_t last_seq_ = 0;
  std::vector<FlightRecord> shadow_;  // the writer's own copy of each slot (never read back from shared memory)
};

// A ring as read at one moment.
struct FlightRingSnapshot {
  FlightRingKind kind = FlightRingKind::kCollective;
  int rank = 0;
  int group = 0;
  int group_rank = 0;
  int group_size = 0;
  int pid = 0;
  uint64_t last_seq = 0;
  std::vector<FlightRecord> records;  // ascending seq; slots torn or rewritten during the read are left out
  size_t torn = 0;                    // how many were
};

// Reads a ring laid over `memory` of `bytes` bytes. nullopt when it is not a ring (wrong
// magic or version, too short). Never blocks (a slot being written is skipped) and never throws.
std::optional<FlightRingSnapshot> readFlightRing(const void* memory, size_t bytes);
// Reads the ring in file `path` (copies it twice with pread, never mapping it: a worker
// truncating the file meanwhile cannot raise SIGBUS in the reader; a slot whose copies differ
// counts as torn). nullopt with `error` set when it cannot, or when the file is larger than a
// ring of kFlightRingMaxCapacity slots. Never blocks (a FIFO is refused) and never throws.
std::optional<FlightRingSnapshot> readFlightRingFile(const std::string& path, std::string* error = nullptr);

// The ring file of one group of one rank inside the agent's directory: "rank5.group0.ring"
// for its collectives, "rank5.group0.p2pring" for its point-to-point messages (another
// extension, so that readers that know only collective rings, which look for ".ring",
// never take one for a collective ring).
std::string flightRingFileName(int rank, int group, FlightRingKind kind = FlightRingKind::kCollective);
// Whether `name` (a file name, no directory) is one that flightRingFileName() makes.
bool isFlightRingFileName(std::string_view name);

}  // namespace ddprun
