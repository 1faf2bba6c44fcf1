#include "agent/torch_trace/pickle_reader.h"

#include <atomic>
#include <chrono>
#include <random>

#include <catch2/catch.hpp>

#include "tests/agent/torch_trace/capped_child.h"
#include "tests/agent/torch_trace/dumps_support.h"
#include "tests/support/fuzz_run.h"

namespace ddprun::agent {
namespace {

using namespace std::string_literals;

// Bytes from pieces, each a string or a byte: bytesOf({"\x80", 2, "]q", 0, "a."}) — no hex
// escape can swallow the character after it.
struct Piece {
  Piece(const char* s) : text(s) {}
  Piece(int b) : text(1, static_cast<char>(b)) {}
  std::string text;
};
std::string bytesOf(std::initializer_list<Piece> pieces) {
  std::string out;
  for (const Piece& p : pieces) out += p.text;
  return out;
}

PickleDocument parse(const std::string& bytes, const PickleLimits& limits = {}) {
  return PickleDocument::parse(bytes, limits);
}

std::string errorOf(const std::string& bytes, const PickleLimits& limits = {}) {
  try {
    parse(bytes, limits);
  } catch (const PickleError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_CASE("pickle: ints of every width, floats, bools, None and strings", "[pickle]") {
  // [1, 300, -2, 70000, -2**40, 1.5, True, False, None, "hé", b"xy"] as protocol 2 opcodes.
  const std::string bytes =
      bytesOf({0x80, 2, "]q", 0,    "(",  "K", 1,   "M", 0x2c, 1, "J",  0xfe, 0xff, 0xff, 0xff, "J", 0x70,
               0x11, 1, 0,    0x8a, 6,    0,   0,   0,   0,    0, 0xff, "G",  0x3f, 0xf8, 0,    0,   0,
               0,    0, 0,    0x88, 0x89, "N", "X", 3,   0,    0, 0,    "h",  0xc3, 0xa9, "C",  2,   "xye."});
  PickleDocument doc = parse(bytes);
  PickleRef root = doc.root();
  REQUIRE(root.kind() == PickleKind::kList);
  REQUIRE(root.size() == 11);
  CHECK(root.at(0).asInt() == 1);
  CHECK(root.at(1).asInt() == 300);
  CHECK(root.at(2).asInt() == -2);
  CHECK(root.at(3).asInt() == 70000);
  CHECK(root.at(4).asInt() == -(int64_t{1} << 40));
  CHECK(root.at(5).asFloat() == 1.5);
  CHECK(root.at(6).asBool());
  CHECK_FALSE(root.at(7).asBool());
  CHECK(root.at(8).isNone());
  CHECK(root.at(9).asString() == "h\xc3\xa9");
  CHECK(root.at(10).kind() == PickleKind::kBytes);
  CHECK(root.at(10).asString() == "xy");
}

TEST_CASE("pickle: memoized values are shared, the last duplicate dict key wins, tuples of each size", "[pickle]") {
  // {"a": (1,), "b": ("a", 2), "a": 3} with "a" memoized and fetched by BINGET.
  const std::string bytes = bytesOf({0x80, 2, "}(X", 1,    0, 0,   0, "aq", 0,   "K", 1,   0x85, "X", 1,
                                     0,    0, 0,     "bh", 0, "K", 2, 0x86, "h", 0,   "K", 3,    "u."});
  PickleDocument doc = parse(bytes);
  PickleRef root = doc.root();
  REQUIRE(root.kind() == PickleKind::kDict);
  REQUIRE(root.get("a"));
  CHECK(root.get("a")->asInt() == 3);
  REQUIRE(root.get("b")->kind() == PickleKind::kTuple);
  CHECK(root.get("b")->at(0).asString() == "a");
  CHECK(root.get("b")->at(1).asInt() == 2);
  CHECK(root.items().size() == 3);
  CHECK_FALSE(root.get("c"));
}

TEST_CASE("pickle: a list that contains itself is read without walking it forever", "[pickle]") {
  // l = []; l.append(l)
  PickleDocument doc = parse(bytesOf({0x80, 2, "]q", 0, "h", 0, "a."}));
  PickleRef root = doc.root();
  REQUIRE(root.size() == 1);
  CHECK(root.at(0).at(0).at(0).kind() == PickleKind::kList);
}

TEST_CASE("pickle: torch's typed lists (build_intlist) read as their list", "[pickle]") {
  PickleDocument doc = parse(bytesOf({0x80, 2, "ctorch.jit._pickle\nbuild_intlist\nq", 0, "(](K", 1, "K", 2, "etR."}));
  REQUIRE(doc.root().kind() == PickleKind::kList);
  CHECK(doc.root().size() == 2);
  CHECK(doc.root().at(1).asInt() == 2);
}

TEST_CASE("pickle: Python's pickle.dump of a dump-like dict reads alike in protocols 2 to 5", "[pickle]") {
  testing::TempDir dir;
  for (int protocol = 2; protocol <= 5; ++protocol) {
    INFO("protocol " << protocol);
    const std::string sub = dir.file("p" + std::to_string(protocol));
    auto result = testing::writeDumps(sub, "behind", "python", protocol);
    REQUIRE(result.exit_code == 0);
    PickleDocument doc = parse(testing::readFile(sub + "/nccl_trace_rank_0"));
    PickleRef root = doc.root();
    REQUIRE(root.get("version"));
    CHECK(root.get("version")->asString() == "2.10");
    REQUIRE(root.get("entries"));
    REQUIRE(root.get("entries")->size() == 2);
    PickleRef e = root.get("entries")->at(1);
    CHECK(e.get("profiling_name")->asString() == "nccl:all_reduce");
    CHECK(e.get("time_created_ns")->asInt() == 1'700'000'010'000'000'000);
    CHECK(e.get("process_group")->at(1).asString() == "default_pg");
  }
}

TEST_CASE("pickle: truncated, corrupt and hostile pickles end in one error naming the place", "[pickle]") {
  CHECK(errorOf("") == "empty: no pickle at all");
  CHECK(errorOf(bytesOf({0x80, 2, "]q", 0, "(K", 1})) ==
        "truncated: the pickle ends at byte 8, inside the opcode at byte 8 (no STOP)");
  CHECK(errorOf(bytesOf({0x80, 2, "X", 0xff, 0xff, 0xff, 0x7f, "abc"})) ==
        "at byte 2: a string of 2147483647 bytes, more than the 67108864 allowed");
  CHECK(errorOf(bytesOf({0x80, 2, "X", 0x10, 0, 0, 0, "abc"})) ==
        "truncated: a string of 16 bytes at byte 2 runs past the end of the pickle (10 bytes)");
  CHECK(errorOf(bytesOf({0x80, 2, 0xff, "."})) ==
        "at byte 2: opcode 0xff is not one a flight-recorder dump uses (a corrupt file, or not a pickle)");
  CHECK(errorOf(bytesOf({0x80, 6, "N."})) == "at byte 0: pickle protocol 6; a flight-recorder dump uses 2 to 5");
  CHECK(errorOf(bytesOf({0x80, 2, "cos\nsystem\nX", 2, 0, 0, 0, "id", 0x85, "R."})) ==
        "at byte 2: the pickle calls os.system, which a flight-recorder dump never does");
  CHECK(errorOf(bytesOf({0x80, 2, "X", 2, 0, 0, 0, "osX", 6, 0, 0, 0, "system", 0x93, "."})) ==
        "at byte 20: the pickle calls os.system, which a flight-recorder dump never does");
  CHECK(errorOf(bytesOf({0x80, 2, "K", 1, "K", 2, "a."})) == "at byte 6: appending to a int, not a list");
  CHECK(errorOf(bytesOf({0x80, 2, "}(K", 1, "u."})) ==
        "at byte 6: an odd number of values (1) for a dict's keys and values");
  CHECK(errorOf(bytesOf({0x80, 2, "}(]K", 1, "u."})) == "at byte 7: a list as a dict key (unhashable)");
  CHECK(errorOf(bytesOf({0x80, 2, "h", 5, "."})) == "at byte 2: memo entry 5 read before it was written");
  CHECK(errorOf(bytesOf({0x80, 2, 0x86, "."})) == "at byte 2: opcode 0x86 on an empty stack");
  CHECK(errorOf(bytesOf({0x80, 2, 0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0, 1, "."})) ==
        "at byte 2: an integer of 9 bytes: more than 64 bits");
  CHECK(errorOf(bytesOf({0x80, 2, 0x8b, 0xff, 0xff, 0xff, 0xff, "."})) ==
        "at byte 2: an integer of 4294967295 bytes: more than 64 bits");
  CHECK(errorOf(bytesOf({0x80, 2, "e."})) == "at byte 2: opcode 0x65 without a MARK");
}

TEST_CASE("pickle: nesting, stack and value counts are bounded", "[pickle]") {
  std::string deep = bytesOf({0x80, 2});
  for (int i = 0; i < 100000; ++i) deep += "](";
  CHECK(errorOf(deep) == "at byte 1027: nesting deeper than 512");
  std::string wide = bytesOf({0x80, 2, "]("});
  for (int i = 0; i < 2000; ++i) wide += "N";
  PickleLimits limits;
  limits.max_stack = 1000;
  CHECK(errorOf(wide, limits) == "at byte 1003: more than 1000 values on the stack");
  // None is one shared value: lists are made each time.
  std::string lists = bytesOf({0x80, 2, "]("});
  for (int i = 0; i < 2000; ++i) lists += "]";
  limits = {};
  limits.max_values = 100;
  CHECK(errorOf(lists, limits) == "at byte 103: more than 100 values");
  limits = {};
  limits.max_bytes = 10;
  CHECK(errorOf(wide, limits) == "2004 bytes, more than the 10 a dump may have");
}

// Mutations of a real-shaped dump: each either parses or throws PickleError, never crashes,
// hangs or allocates past the limits (ASan and the time budget watch).
TEST_CASE("pickle: mutated and truncated dumps never crash the reader", "[pickle][fuzz]") {
  testing::TempDir dir;
  REQUIRE(testing::writeDumps(dir.path(), "groups", "torch").exit_code == 0);
  const std::string good = testing::readFile(dir.file("nccl_trace_rank_1"));
  auto run = testing::fuzzRun("pickle reader");
  std::mt19937 rng(run.seed);
  const auto deadline = std::chrono::steady_clock::now() + run.budget;
  size_t cases = 0, parsed = 0;
  PickleLimits limits;
  limits.max_string_bytes = 1 << 20;
  while (std::chrono::steady_clock::now() < deadline) {
    std::string bytes = good;
    const int kind = static_cast<int>(rng() % 4);
    if (kind == 0) {
      bytes.resize(rng() % bytes.size());
    } else {
      const int flips = 1 + static_cast<int>(rng() % 8);
      for (int i = 0; i < flips; ++i) {
        size_t at = rng() % bytes.size();
        bytes[at] = kind == 1 ? static_cast<char>(rng()) : static_cast<char>(bytes[at] ^ (1 << (rng() % 8)));
      }
      if (kind == 3) bytes.insert(rng() % bytes.size(), std::string(1 + rng() % 16, static_cast<char>(rng())));
    }
    try {
      PickleDocument doc = PickleDocument::parse(bytes, limits);
      ++parsed;
      (void)doc.root().kind();
    } catch (const PickleError&) {
    }
    ++cases;
  }
  INFO(cases << " cases, " << parsed << " parsed");
  CHECK(cases > 0);
}

// `body` repeated `n` times between a protocol header and `tail`.
std::string repeated(int protocol, const std::string& body, size_t n, const std::string& tail = "}.") {
  std::string out = bytesOf({0x80, protocol});
  out.reserve(out.size() + body.size() * n + tail.size());
  for (size_t i = 0; i < n; ++i) out += body;
  return out + tail;
}

// The exit status of a read of `bytes` in a capped child: 0 read within the bound (checked on
// the document), 1 over it, 2 a PickleError of memory, 3 another PickleError.
int readInChild(const std::string& bytes) {
  try {
    PickleDocument doc = PickleDocument::parse(bytes);
    const PickleLimits limits;
    return doc.memoryBytes() <= limits.memory_per_byte * bytes.size() + limits.memory_floor ? 0 : 1;
  } catch (const PickleError& e) {
    return std::string(e.what()).find("bytes of memory") != std::string::npos ? 2 : 3;
  }
}

// Issue 44: the reader kept an 80-byte value per opcode (and a hash node per memo entry), 40
// times the file: 64 MB of "N0" ended in bad_alloc under a 1 GiB cap. A shared None, a memo
// indexed by id and 16-byte values keep these within 12 times the size (a vector's growth
// included), under a cap of a little more than that.
TEST_CASE("pickle: many tiny values read within 12 times the pickle's size, under an address-space cap", "[pickle]") {
  const size_t n = size_t{2} << 20;
  const std::pair<const char*, std::string> cases[] = {
      {"None pushed and popped", repeated(2, "N0", n)},
      {"None memoized and popped", repeated(4,
                                            "N\x94"
                                            "0",
                                            n)},
      {"None put in the memo by id", repeated(2, bytesOf({"Nr", 1, 0, 0, 0, "0"}), n)},
      {"ints pushed and popped", repeated(2,
                                          "M\x01\x02"
                                          "0",
                                          n)},
      {"short strings", repeated(2,
                                 "\x8c\x01"
                                 "a0",
                                 n)},
  };
  for (const auto& [what, bytes] : cases) {
    INFO(what << ", " << bytes.size() << " bytes");
    const auto run = testing::inCappedChild(14 * bytes.size() + (size_t{32} << 20), std::chrono::seconds(60),
                                            [&] { return readInChild(bytes); });
    CHECK(run.finished);
    CHECK(run.exit_code == 0);
  }
}

TEST_CASE("pickle: a pickle that needs more than 12 times its size ends in one error naming the bound", "[pickle]") {
  // Each TUPLE1 (one byte) makes a tuple of the one below: 20 bytes a byte, more with growth.
  const std::string chain = bytesOf({0x80, 2, "N"}) + std::string(size_t{1} << 20, '\x85') + "0}.";
  CHECK_THAT(errorOf(chain), Catch::Matches("at byte [0-9]+: the pickle needs more than 16777288 bytes of memory \\(12 "
                                            "times its 1048582 bytes, plus 4194304\\), more than a flight-recorder "
                                            "dump ever does"));
  PickleLimits limits;
  limits.memory_per_byte = 64;
  CHECK(PickleDocument::parse(chain, limits).root().kind() == PickleKind::kDict);
}

TEST_CASE("pickle: a key looked up in a dict of many duplicate keys is the last one set, found at once", "[pickle]") {
  // {"a": 0, "k": 1, "k": 2, ... "k": 200000, "b": 7}, the keys memoized.
  std::string bytes = bytesOf({0x80, 2, "}(X", 1, 0, 0, 0, "aK", 0, "X", 1, 0, 0, 0, "kq", 1, "J", 1, 0, 0, 0});
  for (int i = 2; i <= 200000; ++i) {
    bytes += bytesOf({"h", 1, "J"});
    for (int b = 0; b < 4; ++b) bytes += static_cast<char>((i >> (8 * b)) & 0xff);
  }
  bytes += bytesOf({"X", 1, 0, 0, 0, "bK", 7, "u."});
  PickleDocument doc = parse(bytes);
  PickleRef root = doc.root();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 100000; ++i) {
    REQUIRE(root.get("k"));
    REQUIRE(root.get("b"));
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK(root.get("k")->asInt() == 200000);
  CHECK(root.get("a")->asInt() == 0);
  CHECK(root.get("b")->asInt() == 7);
  CHECK_FALSE(root.get("c"));
  CHECK(root.items().size() == 200002);
}

TEST_CASE("pickle: a cancelled read stops with one error", "[pickle]") {
  std::atomic<bool> cancel{true};
  PickleLimits limits;
  limits.cancel = &cancel;
  CHECK(errorOf(repeated(2, "N0", 100000), limits) == "cancelled");
}

// Pickles built to amplify memory or time, as large as the fuzz tier affords: each reads
// within the bound or ends in its error, under an address-space cap of a little more, in
// seconds.
TEST_CASE("pickle: pickles built to amplify memory and time stay within the bound", "[pickle][fuzz]") {
  const size_t n = size_t{8} << 20;
  std::string sparse_memo = bytesOf({0x80, 2});
  for (uint32_t id = 0; id < (1u << 20); ++id) {
    const uint32_t at = id * 4096;  // ids far apart: a memo indexed by id must not fill the gaps blindly
    sparse_memo += "Nr";
    for (int b = 0; b < 4; ++b) sparse_memo += static_cast<char>((at >> (8 * b)) & 0xff);
    sparse_memo += "0";
  }
  sparse_memo += "}.";
  std::string long_keys = bytesOf({0x80, 2, "}("});
  // Two 1 MB keys that differ in their last byte, named alternately by 400,000 pairs.
  for (char last : {'x', 'y'}) {
    long_keys +=
        bytesOf({"X", 0, 0, 0x10, 0}) + std::string((1 << 20) - 1, 'k') + last + (last == 'x' ? "q\x01" : "q\x02");
    long_keys += "N";
  }
  for (int i = 0; i < 400000; ++i) long_keys += (i % 2 ? "h\x01N" : "h\x02N");
  long_keys += "u.";
  const std::pair<const char*, std::string> cases[] = {
      {"None pushed and popped", repeated(2, "N0", n)},
      {"None memoized and popped", repeated(4,
                                            "N\x94"
                                            "0",
                                            n)},
      {"empty lists, each appended to the first", bytesOf({0x80, 2, "]"}) + repeated(2, "]a", n).substr(2)},
      {"empty dicts, each set in the first", bytesOf({0x80, 2, "}"}) + repeated(2, "K\x01}s", n).substr(2)},
      {"one-tuples of one-tuples", bytesOf({0x80, 2, "N"}) + std::string(n, '\x85') + "0}."},
      {"floats", repeated(2,
                          "G\x3f\xf0\x00\x00\x00\x00\x00\x00"
                          "0",
                          n / 4)},
      {"memo ids far apart", sparse_memo},
      {"two long keys alternating in a large dict", long_keys},
  };
  for (const auto& [what, bytes] : cases) {
    INFO(what << ", " << bytes.size() << " bytes");
    const auto run = testing::inCappedChild(14 * bytes.size() + (size_t{32} << 20), std::chrono::seconds(30),
                                            [&] { return readInChild(bytes) == 1 ? 1 : 0; });
    CHECK(run.finished);
    CHECK(run.exit_code == 0);
    CHECK(run.seconds < 20);
  }
}

}  // namespace
}  // namespace ddprun::agent
