#include "common/flight_ring.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>

#include <catch2/catch.hpp>

namespace ddprun {
namespace {

struct Ring {
  explicit Ring(uint32_t capacity) : bytes(flightRingBytes(capacity)) {
    memory.reset(static_cast<char*>(std::aligned_alloc(64, bytes)));
    std::memset(memory.get(), 0, bytes);
  }
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  size_t bytes;
  std::unique_ptr<char, Free> memory;
  FlightEntry* entry(size_t slot) {
    return reinterpret_cast<FlightEntry*>(memory.get() + sizeof(FlightRingHeader)) + slot;
  }
};

FlightOpInfo allReduce(uint64_t count) { return {FlightOp::kAllReduce, FlightDType::kFloat32, count, -1}; }

}  // namespace

TEST_CASE("flight ring: what is written reads back with every field") {
  Ring ring(8);
  FlightRingWriter w(ring.memory.get(), 8, 5, 2, 1, 4);
  const uint64_t a = w.enqueue(allReduce(1024), 100);
  const uint64_t b = w.enqueue({FlightOp::kBroadcast, FlightDType::kInt64, 7, 3}, 110);
  w.start(a, 120);
  w.finish(a, true, 130);
  w.start(b, 140);
  auto s = readFlightRing(ring.memory.get(), ring.bytes);
  REQUIRE(s);
  CHECK(s->rank == 5);
  CHECK(s->group == 2);
  CHECK(s->group_rank == 1);
  CHECK(s->group_size == 4);
  CHECK(s->pid == ::getpid());
  CHECK(s->last_seq == 2);
  CHECK(s->torn == 0);
  REQUIRE(s->records.size() == 2);
  const auto& r0 = s->records[0];
  CHECK(r0.seq == 1);
  CHECK(r0.info.op == FlightOp::kAllReduce);
  CHECK(r0.info.dtype == FlightDType::kFloat32);
  CHECK(r0.info.count == 1024);
  CHECK(r0.info.root == -1);
  CHECK(r0.state == FlightState::kCompleted);
  CHECK(r0.enqueued_ns == 100);
  CHECK(r0.started_ns == 120);
  CHECK(r0.ended_ns == 130);
  const auto& r1 = s->records[1];
  CHECK(r1.seq == 2);
  CHECK(r1.info.op == FlightOp::kBroadcast);
  CHECK(r1.info.dtype == FlightDType::kInt64);
  CHECK(r1.info.root == 3);
  CHECK(r1.state == FlightState::kStarted);
  CHECK(r1.ended_ns == 0);
}

TEST_CASE("flight ring: after wrapping around the last capacity operations remain") {
  Ring ring(4);
  FlightRingWriter w(ring.memory.get(), 4, 0, 0, 0, 2);
  for (int i = 1; i <= 10; ++i) {
    const uint64_t seq = w.enqueue(allReduce(i), i);
    w.start(seq, i);
    w.finish(seq, i != 9, i);
  }
  // The slot of #3 now holds #7: finishing #3 late must not touch it.
  w.finish(3, false, 99);
  auto s = readFlightRing(ring.memory.get(), ring.bytes);
  REQUIRE(s);
  CHECK(s->last_seq == 10);
  REQUIRE(s->records.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(s->records[i].seq == static_cast<uint64_t>(7 + i));
    CHECK(s->records[i].info.count == static_cast<uint64_t>(7 + i));
  }
  CHECK(s->records[0].state == FlightState::kCompleted);
  CHECK(s->records[2].state == FlightState::kFailed);
}

TEST_CASE("flight ring: a slot being written or rewritten during the read is left out") {
  Ring ring(4);
  FlightRingWriter w(ring.memory.get(), 4, 0, 0, 0, 2);
  for (int i = 1; i <= 3; ++i) w.enqueue(allReduce(i), i);
  // A writer stopped in the middle of a write leaves the version odd.
  ring.entry(1)->version += 1;
  // A slot that already holds a later operation than the header says (a wrap raced the read).
  ring.entry(2)->seq = 7;
  auto s = readFlightRing(ring.memory.get(), ring.bytes);
  REQUIRE(s);
  CHECK(s->torn == 2);
  REQUIRE(s->records.size() == 1);
  CHECK(s->records[0].seq == 1);
}

TEST_CASE("flight ring: memory that is not a ring is refused") {
  Ring ring(4);
  CHECK_FALSE(readFlightRing(ring.memory.get(), ring.bytes));  // no magic yet
  FlightRingWriter w(ring.memory.get(), 4, 0, 0, 0, 2);
  CHECK(readFlightRing(ring.memory.get(), ring.bytes));
  CHECK_FALSE(readFlightRing(ring.memory.get(), ring.bytes - 1));  // shorter than its slots
  CHECK_FALSE(readFlightRing(ring.memory.get(), 10));
}

TEST_CASE("flight ring: a reader racing the writer sees only whole records") {
  Ring ring(8);
  FlightRingWriter w(ring.memory.get(), 8, 0, 0, 0, 2);
  std::atomic<bool> done{false};
  // Each record's fields are derived from its seq: a torn copy would break the relation.
  std::thread writer([&] {
    for (uint64_t i = 1; i <= 100000; ++i) {
      const uint64_t seq = w.enqueue(allReduce(i * 3), static_cast<int64_t>(i * 5));
      w.start(seq, static_cast<int64_t>(i * 7));
      w.finish(seq, true, static_cast<int64_t>(i * 11));
    }
    done = true;
  });
  size_t bad = 0, seen = 0;
  while (!done) {
    auto s = readFlightRing(ring.memory.get(), ring.bytes);
    if (!s) continue;
    for (const auto& r : s->records) {
      ++seen;
      const auto i = static_cast<int64_t>(r.seq);
      if (r.info.count != r.seq * 3 || r.enqueued_ns != i * 5 || (r.started_ns != 0 && r.started_ns != i * 7) ||
          (r.ended_ns != 0 && r.ended_ns != i * 11) || (r.state == FlightState::kCompleted && r.ended_ns == 0)) {
        ++bad;
      }
    }
  }
  writer.join();
  CHECK(bad == 0);
  auto s = readFlightRing(ring.memory.get(), ring.bytes);
  REQUIRE(s);
  CHECK(s->records.size() == 8);
  CHECK(s->records.back().seq == 100000);
}

TEST_CASE("flight ring: a point-to-point ring says so in its flags word and numbers its messages apart") {
  Ring p2p(4);
  FlightRingWriter w(p2p.memory.get(), 4, 3, 1, 0, 2, FlightRingKind::kPointToPoint);
  const uint64_t a = w.enqueue({FlightOp::kSend, FlightDType::kFloat32, 16, 1}, 10);
  const uint64_t b = w.enqueue({FlightOp::kRecv, FlightDType::kNone, 5, 1}, 11);
  w.start(a, 12);
  w.finish(a, true, 13);
  w.start(b, 14);
  CHECK(reinterpret_cast<const FlightRingHeader*>(p2p.memory.get())->flags == kFlightRingFlagPointToPoint);
  auto s = readFlightRing(p2p.memory.get(), p2p.bytes);
  REQUIRE(s);
  CHECK(s->kind == FlightRingKind::kPointToPoint);
  REQUIRE(s->records.size() == 2);
  CHECK(s->records[0].seq == 1);
  CHECK(s->records[0].info.op == FlightOp::kSend);
  CHECK(s->records[0].info.root == 1);
  CHECK(s->records[0].state == FlightState::kCompleted);
  CHECK(s->records[1].seq == 2);
  CHECK(s->records[1].info.op == FlightOp::kRecv);
  CHECK(s->records[1].info.count == 5);
  CHECK(s->records[1].state == FlightState::kStarted);
  CHECK(flightOpName(FlightOp::kSend) == "send");
  CHECK(flightOpName(FlightOp::kRecv) == "recv");

  Ring collective(4);
  FlightRingWriter c(collective.memory.get(), 4, 3, 1, 0, 2);
  c.enqueue(allReduce(1), 1);
  CHECK(reinterpret_cast<const FlightRingHeader*>(collective.memory.get())->flags == 0);
  s = readFlightRing(collective.memory.get(), collective.bytes);
  REQUIRE(s);
  CHECK(s->kind == FlightRingKind::kCollective);
}

TEST_CASE("flight ring: a ring written before the flags word existed reads as a collective ring") {
  // The version-1 layout as an older writer left it: the last header word reserved and zero.
  Ring ring(2);
  auto* h = reinterpret_cast<FlightRingHeader*>(ring.memory.get());
  h->magic = kFlightRingMagic;
  h->version_capacity = uint64_t{1} << 32 | 2;
  h->rank = 6;
  h->group_rank_size = uint64_t{6} << 32 | 8;
  h->last_seq = 1;
  FlightEntry* e = ring.entry(0);
  e->version = 2;
  e->seq = 1;
  e->meta = uint64_t{static_cast<uint8_t>(FlightOp::kAllReduce)} |
            uint64_t{static_cast<uint8_t>(FlightState::kStarted)} << 16 | uint64_t{0xffffffffu} << 32;
  e->count = 9;
  auto s = readFlightRing(ring.memory.get(), ring.bytes);
  REQUIRE(s);
  CHECK(s->kind == FlightRingKind::kCollective);
  CHECK(s->rank == 6);
  REQUIRE(s->records.size() == 1);
  CHECK(s->records[0].info.op == FlightOp::kAllReduce);
  CHECK(s->records[0].info.root == -1);
  CHECK(s->records[0].info.count == 9);
}

TEST_CASE("flight ring: the point-to-point ring has a file name of its own that readers of rings recognise") {
  CHECK(flightRingFileName(3, 1, FlightRingKind::kPointToPoint) == "rank3.group1.p2pring");
  CHECK(flightRingFileName(3, 1, FlightRingKind::kCollective) == "rank3.group1.ring");
  CHECK(isFlightRingFileName("rank3.group1.ring"));
  CHECK(isFlightRingFileName("rank3.group1.p2pring"));
  CHECK_FALSE(isFlightRingFileName("rank3.group1.ring.tmp"));
  CHECK_FALSE(isFlightRingFileName(".ring"));
  CHECK_FALSE(isFlightRingFileName("notes.txt"));
  CHECK(flightDTypeBytes(FlightDType::kFloat64) == 8);
  CHECK(flightDTypeBytes(FlightDType::kBFloat16) == 2);
  CHECK(flightDTypeBytes(FlightDType::kNone) == 1);
}

TEST_CASE("flight ring: a ring in a file is read through the file") {
  char dir_template[] = "/tmp/flight_ring_test.XXXXXX";
  REQUIRE(::mkdtemp(dir_template));
  const std::string path = std::string(dir_template) + "/" + flightRingFileName(3, 1);
  CHECK(flightRingFileName(3, 1) == "rank3.group1.ring");
  Ring ring(4);
  FlightRingWriter w(ring.memory.get(), 4, 3, 1, 0, 2);
  w.enqueue({FlightOp::kBarrier, FlightDType::kNone, 0, -1}, 1);
  std::ofstream(path, std::ios::binary).write(ring.memory.get(), static_cast<std::streamsize>(ring.bytes));
  std::string error;
  auto s = readFlightRingFile(path, &error);
  REQUIRE(s);
  CHECK(s->rank == 3);
  REQUIRE(s->records.size() == 1);
  CHECK(s->records[0].info.op == FlightOp::kBarrier);
  CHECK_FALSE(readFlightRingFile(std::string(dir_template) + "/missing", &error));
  CHECK(error.find("missing") != std::string::npos);
  std::remove(path.c_str());
  ::rmdir(dir_template);
}

TEST_CASE("flight ring: a worker's ring file of any size or claimed capacity costs the reader no more than a ring") {
  char dir_template[] = "/tmp/flight_ring_test.XXXXXX";
  REQUIRE(::mkdtemp(dir_template));
  const std::string path = std::string(dir_template) + "/" + flightRingFileName(0, 0);
  // A header that claims 2^32 - 1 slots, in a sparse file of 300 GiB (costs the worker nothing).
  Ring ring(4);
  FlightRingWriter w(ring.memory.get(), 4, 0, 0, 0, 2);
  w.enqueue(allReduce(1), 1);
  reinterpret_cast<FlightRingHeader*>(ring.memory.get())->version_capacity =
      uint64_t{kFlightRingVersion} << 32 | 0xffffffffu;
  reinterpret_cast<FlightRingHeader*>(ring.memory.get())->last_seq = 0xfffffff0u;
  std::ofstream(path, std::ios::binary).write(ring.memory.get(), static_cast<std::streamsize>(ring.bytes));
  REQUIRE(::truncate(path.c_str(), off_t{300} << 30) == 0);
  std::string error;
  CHECK_FALSE(readFlightRingFile(path, &error));
  CHECK(error.find("more than a ring of 4096 slots") != std::string::npos);
  // The same header in a file of ring size: refused as no ring, not read for billions of slots.
  REQUIRE(::truncate(path.c_str(), static_cast<off_t>(flightRingBytes(kFlightRingMaxCapacity))) == 0);
  CHECK_FALSE(readFlightRingFile(path, &error));
  CHECK(error.find("not a flight recorder ring") != std::string::npos);
  std::remove(path.c_str());
  ::rmdir(dir_template);
}

TEST_CASE("flight ring: a worker that truncates and regrows its ring file while it is read never crashes the reader") {
  // Through a mapping, a read past the end of a file truncated meanwhile raises SIGBUS: the
  // reader (the agent) would die. The file is copied instead.
  char dir_template[] = "/tmp/flight_ring_test.XXXXXX";
  REQUIRE(::mkdtemp(dir_template));
  const std::string path = std::string(dir_template) + "/" + flightRingFileName(0, 0);
  constexpr uint32_t kCapacity = 4096;
  Ring ring(kCapacity);
  FlightRingWriter w(ring.memory.get(), kCapacity, 0, 0, 0, 2);
  for (int i = 0; i < 5000; ++i) w.finish(w.enqueueStarted(allReduce(1), i + 1), true, i + 2);
  std::ofstream(path, std::ios::binary).write(ring.memory.get(), static_cast<std::streamsize>(ring.bytes));
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    for (int i = 0; !stop.load(); ++i) {
      if (::truncate(path.c_str(), (i % 2) != 0 ? static_cast<off_t>(ring.bytes) : 4096) != 0) break;
    }
  });
  int whole = 0;
  for (int i = 0; i < 2000; ++i) {
    auto s = readFlightRingFile(path);
    if (s && s->records.size() == kCapacity) ++whole;
  }
  stop = true;
  churn.join();
  // Reads that met a short file were refused; the rest are rings (the regrown part reads as zeros).
  SUCCEED("2000 reads raced the truncations without a crash; " << whole << " read every slot");
  std::remove(path.c_str());
  ::rmdir(dir_template);
}

}  // namespace ddprun
