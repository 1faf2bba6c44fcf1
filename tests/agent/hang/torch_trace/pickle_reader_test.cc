#include "agent/hang/torch_trace/pickle_reader.h"

#include <chrono>
#include <random>

#include <catch2/catch.hpp>

#include "tests/agent/hang/torch_trace/dumps_support.h"
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
  limits = {};
  limits.max_values = 100;
  CHECK(errorOf(wide, limits) == "at byte 103: more than 100 values");
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

}  // namespace
}  // namespace ddprun::agent
