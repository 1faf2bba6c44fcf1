#include "common/flight_ring.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/unique_fd.h"
#include "common/worker_file.h"

namespace ddprun {

namespace {

// Every word is shared with another process that may read it at any time.
uint64_t load(const uint64_t& word, std::memory_order order = std::memory_order_relaxed) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(word)).load(order);
}
void store(uint64_t& word, uint64_t value, std::memory_order order = std::memory_order_relaxed) {
  std::atomic_ref<uint64_t>(word).store(value, order);
}

uint64_t packMeta(const FlightRecord& r) {
  return uint64_t{static_cast<uint8_t>(r.info.op)} | uint64_t{static_cast<uint8_t>(r.info.dtype)} << 8 |
         uint64_t{static_cast<uint8_t>(r.state)} << 16 | uint64_t{static_cast<uint32_t>(r.info.root)} << 32;
}

}  // namespace

std::string_view flightOpName(FlightOp op) {
  switch (op) {
    case FlightOp::kUnknown: return "operation";
    case FlightOp::kBroadcast: return "broadcast";
    case FlightOp::kAllReduce: return "all_reduce";
    case FlightOp::kReduce: return "reduce";
    case FlightOp::kAllGather: return "all_gather";
    case FlightOp::kGather: return "gather";
    case FlightOp::kScatter: return "scatter";
    case FlightOp::kReduceScatter: return "reduce_scatter";
    case FlightOp::kAllToAll: return "all_to_all";
    case FlightOp::kBarrier: return "barrier";
    case FlightOp::kSend: return "send";
    case FlightOp::kRecv: return "recv";
  }
  return "operation";
}

std::string_view flightDTypeName(FlightDType dtype) {
  switch (dtype) {
    case FlightDType::kFloat32: return "float32";
    case FlightDType::kFloat64: return "float64";
    case FlightDType::kFloat16: return "float16";
    case FlightDType::kBFloat16: return "bfloat16";
    case FlightDType::kInt32: return "int32";
    case FlightDType::kInt64: return "int64";
    case FlightDType::kUInt8: return "uint8";
    case FlightDType::kNone: return "bytes";
  }
  return "bytes";
}

size_t flightDTypeBytes(FlightDType dtype) {
  switch (dtype) {
    case FlightDType::kFloat32: return 4;
    case FlightDType::kFloat64: return 8;
    case FlightDType::kFloat16: return 2;
    case FlightDType::kBFloat16: return 2;
    case FlightDType::kInt32: return 4;
    case FlightDType::kInt64: return 8;
    case FlightDType::kUInt8: return 1;
    case FlightDType::kNone: return 1;
  }
  return 1;
}

std::string_view flightStateName(FlightState state) {
  switch (state) {
    case FlightState::kEnqueued: return "enqueued";
    case FlightState::kStarted: return "started";
    case FlightState::kCompleted: return "completed";
    case FlightState::kFailed: return "failed";
  }
  return "enqueued";
}

FlightRingWriter::FlightRingWriter(void* memory, uint32_t capacity, int rank, int group, int group_rank, int group_size,
                                   FlightRingKind kind)
    : header_(static_cast<FlightRingHeader*>(memory)),
      entries_(reinterpret_cast<FlightEntry*>(static_cast<char*>(memory) + sizeof(FlightRingHeader))),
      capacity_(capacity),
      shadow_(capacity) {
  store(header_->version_capacity, uint64_t{kFlightRingVersion} << 32 | capacity);
  store(header_->rank, static_cast<uint64_t>(rank));
  store(header_->group, static_cast<uint64_t>(group));
  store(header_->group_rank_size,
        uint64_t{static_cast<uint32_t>(group_rank)} << 32 | static_cast<uint32_t>(group_size));
  store(header_->pid, static_cast<uint64_t>(::getpid()));
  store(header_->last_seq, 0);
  store(header_->flags, kind == FlightRingKind::kPointToPoint ? kFlightRingFlagPointToPoint : 0);
  // The magic last: a reader that sees it sees a complete header.
  store(header_->magic, kFlightRingMagic, std::memory_order_release);
}

FlightEntry* FlightRingWriter::slot(uint64_t seq) const { return &entries_[(seq - 1) % capacity_]; }

void FlightRingWriter::write(FlightEntry* e, const FlightRecord& r) {
  const uint64_t v = load(e->version);
  store(e->version, v + 1);
  std::atomic_thread_fence(std::memory_order_release);
  store(e->seq, r.seq);
  store(e->meta, packMeta(r));
  store(e->count, r.info.count);
  store(e->enqueued_ns, static_cast<uint64_t>(r.enqueued_ns));
  store(e->started_ns, static_cast<uint64_t>(r.started_ns));
  store(e->ended_ns, static_cast<uint64_t>(r.ended_ns));
  store(e->version, v + 2, std::memory_order_release);
}

// A state change touches two words of a slot: only those are rewritten (the collective
// thread pays this twice per operation).
void FlightRingWriter::update(FlightEntry* e, const FlightRecord& r, uint64_t FlightEntry::*stamp, int64_t now_ns) {
  const uint64_t v = load(e->version);
  store(e->version, v + 1);
  std::atomic_thread_fence(std::memory_order_release);
  store(e->meta, packMeta(r));
  store(e->*stamp, static_cast<uint64_t>(now_ns));
  store(e->version, v + 2, std::memory_order_release);
}

uint64_t FlightRingWriter::append(const FlightOpInfo& info, FlightState state, int64_t now_ns) {
  if (!header_) return 0;
  const uint64_t seq = ++last_seq_;
  FlightRecord& r = shadow_[(seq - 1) % capacity_];
  r = FlightRecord{seq, info, state, now_ns, state == FlightState::kStarted ? now_ns : 0, 0};
  write(slot(seq), r);
  store(header_->last_seq, seq, std::memory_order_release);
  return seq;
}

uint64_t FlightRingWriter::enqueue(const FlightOpInfo& info, int64_t now_ns) {
  return append(info, FlightState::kEnqueued, now_ns);
}

uint64_t FlightRingWriter::enqueueStarted(const FlightOpInfo& info, int64_t now_ns) {
  return append(info, FlightState::kStarted, now_ns);
}

void FlightRingWriter::start(uint64_t seq, int64_t now_ns) {
  if (!header_ || seq == 0) return;
  FlightRecord& r = shadow_[(seq - 1) % capacity_];
  if (r.seq != seq) return;
  r.state = FlightState::kStarted;
  r.started_ns = now_ns;
  update(slot(seq), r, &FlightEntry::started_ns, now_ns);
}

void FlightRingWriter::finish(uint64_t seq, bool ok, int64_t now_ns) {
  if (!header_ || seq == 0) return;
  FlightRecord& r = shadow_[(seq - 1) % capacity_];
  if (r.seq != seq) return;
  r.state = ok ? FlightState::kCompleted : FlightState::kFailed;
  r.ended_ns = now_ns;
  update(slot(seq), r, &FlightEntry::ended_ns, now_ns);
}

std::optional<FlightRingSnapshot> readFlightRing(const void* memory, size_t bytes) {
  if (bytes < sizeof(FlightRingHeader)) return std::nullopt;
  const auto* h = static_cast<const FlightRingHeader*>(memory);
  if (load(h->magic, std::memory_order_acquire) != kFlightRingMagic) return std::nullopt;
  const uint64_t vc = load(h->version_capacity);
  const auto capacity = static_cast<uint32_t>(vc);
  if (vc >> 32 != kFlightRingVersion || capacity == 0 || capacity > kFlightRingMaxCapacity ||
      bytes < flightRingBytes(capacity)) {
    return std::nullopt;
  }
  FlightRingSnapshot s;
  s.kind =
      (load(h->flags) & kFlightRingFlagPointToPoint) != 0 ? FlightRingKind::kPointToPoint : FlightRingKind::kCollective;
  s.rank = static_cast<int>(load(h->rank));
  s.group = static_cast<int>(load(h->group));
  const uint64_t grs = load(h->group_rank_size);
  s.group_rank = static_cast<int>(grs >> 32);
  s.group_size = static_cast<int>(static_cast<uint32_t>(grs));
  s.pid = static_cast<int>(load(h->pid));
  s.last_seq = load(h->last_seq, std::memory_order_acquire);
  const auto* entries =
      reinterpret_cast<const FlightEntry*>(static_cast<const char*>(memory) + sizeof(FlightRingHeader));
  const uint64_t first = s.last_seq > capacity ? s.last_seq - capacity + 1 : 1;
  for (uint64_t seq = first; seq <= s.last_seq; ++seq) {
    const FlightEntry& e = entries[(seq - 1) % capacity];
    const uint64_t v1 = load(e.version, std::memory_order_acquire);
    FlightRecord r;
    r.seq = load(e.seq);
    const uint64_t meta = load(e.meta);
    r.info.count = load(e.count);
    r.enqueued_ns = static_cast<int64_t>(load(e.enqueued_ns));
    r.started_ns = static_cast<int64_t>(load(e.started_ns));
    r.ended_ns = static_cast<int64_t>(load(e.ended_ns));
    std::atomic_thread_fence(std::memory_order_acquire);
    const uint64_t v2 = load(e.version);
    // Odd: being written; changed: rewritten meanwhile; another seq: the ring wrapped past it.
    if ((v1 & 1) != 0 || v1 != v2 || r.seq != seq) {
      ++s.torn;
      continue;
    }
    r.info.op = static_cast<FlightOp>(meta & 0xff);
    r.info.dtype = static_cast<FlightDType>((meta >> 8) & 0xff);
    r.state = static_cast<FlightState>((meta >> 16) & 0xff);
    r.info.root = static_cast<int32_t>(static_cast<uint32_t>(meta >> 32));
    s.records.push_back(r);
  }
  return s;
}

namespace {

// All of `fd` from offset 0 into `out` (`bytes` bytes); false on an error or a short read
// (the file shrank meanwhile).
bool readWhole(int fd, char* out, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, out + done, bytes - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

std::optional<FlightRingSnapshot> readFlightRingFile(const std::string& path, std::string* error) {
  auto fail = [&](const std::string& what) -> std::optional<FlightRingSnapshot> {
    if (error) *error = what;
    return std::nullopt;
  };
  // A worker makes the files in the ring directory: a FIFO there must not block the agent.
  struct stat st {};
  std::string problem;
  const UniqueFd fd = openWorkerFile(path, st, &problem);
  if (!fd) return fail(problem);
  const auto bytes = static_cast<size_t>(st.st_size);
  if (bytes < sizeof(FlightRingHeader)) return fail(fmt::format("{}: {} bytes is too short for a ring", path, bytes));
  // Any size a worker likes (a sparse file costs it nothing) must not cost the agent more
  // than the largest ring's read.
  if (bytes > flightRingBytes(kFlightRingMaxCapacity)) {
    return fail(fmt::format("{}: {} bytes is more than a ring of {} slots, the most ddprun reads", path, bytes,
                            kFlightRingMaxCapacity));
  }
  // The header first: only the slots it claims are read (a file may be larger than its ring).
  FlightRingHeader header{};
  errno = 0;
  if (!readWhole(fd.get(), reinterpret_cast<char*>(&header), sizeof header)) {
    return fail(fmt::format("read {}: {}", path, errno != 0 ? std::strerror(errno) : "the file shrank"));
  }
  const auto capacity = static_cast<uint32_t>(header.version_capacity);
  if (header.magic != kFlightRingMagic || header.version_capacity >> 32 != kFlightRingVersion || capacity == 0 ||
      capacity > kFlightRingMaxCapacity || bytes < flightRingBytes(capacity)) {
    return fail(fmt::format("{}: not a flight recorder ring", path));
  }
  // Copied twice with pread rather than mapped: a worker that truncates its file while the
  // agent reads it would raise SIGBUS in the agent through a mapping. A copy is not atomic
  // per word, so a slot counts only when both copies agree; one that differs was being
  // written and is left out as the mapped seqlock read leaves it out.
  const size_t words = flightRingBytes(capacity) / sizeof(uint64_t);
  std::vector<uint64_t> first(words), second(words);
  const size_t whole = words * sizeof(uint64_t);
  errno = 0;
  if (!readWhole(fd.get(), reinterpret_cast<char*>(first.data()), whole) ||
      !readWhole(fd.get(), reinterpret_cast<char*>(second.data()), whole)) {
    return fail(fmt::format("read {}: {}", path, errno != 0 ? std::strerror(errno) : "the file shrank"));
  }
  constexpr size_t kHeaderWords = sizeof(FlightRingHeader) / sizeof(uint64_t);
  constexpr size_t kSlotWords = sizeof(FlightEntry) / sizeof(uint64_t);
  for (size_t slot = kHeaderWords; slot + kSlotWords <= words; slot += kSlotWords) {
    if (!std::equal(first.begin() + slot, first.begin() + slot + kSlotWords, second.begin() + slot)) {
      first[slot] = 1;  // an odd version: a slot being written
    }
  }
  auto snapshot = readFlightRing(first.data(), whole);
  if (!snapshot) return fail(fmt::format("{}: not a flight recorder ring", path));
  return snapshot;
}

std::string flightRingFileName(int rank, int group, FlightRingKind kind) {
  return fmt::format("rank{}.group{}.{}", rank, group, kind == FlightRingKind::kPointToPoint ? "p2pring" : "ring");
}

bool isFlightRingFileName(std::string_view name) {
  auto endsWith = [name](std::string_view tail) {
    return name.size() > tail.size() && name.substr(name.size() - tail.size()) == tail;
  };
  return endsWith(".ring") || endsWith(".p2pring");
}

}  // namespace ddprun
