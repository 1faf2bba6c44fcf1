// The trace positions in the node's published progress (agent/hang/rings/trace_position.h,
// progress_summary.h): a line and back, forged lines kept out, and both ways across versions:
// a value of an agent from before trace positions reads as before, and a value with them reads,
// line by line, as an older decoder reads it (the header unchanged, each trace line one it
// rejects, every other line the same).
#include <catch2/catch.hpp>

#include "agent/hang/rings/progress_summary.h"
#include "agent/hang/rings/trace_position.h"

using namespace ddprun::agent;

namespace {

TracePosition row(int rank, int group, uint64_t seq, std::string op, TraceState state, double age_s) {
  TracePosition p;
  p.rank = rank;
  p.group = group;
  p.seq = seq;
  p.op = std::move(op);
  p.state = state;
  p.age_s = age_s;
  return p;
}

std::vector<std::string> linesOf(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1)
    out.push_back(text.substr(start, nl - start));
  return out;
}

}  // namespace

TEST_CASE("Trace positions: a line and back", "[unit][straggler]") {
  const TracePosition p = row(3, 2, 4711, "_allgather_base", TraceState::kStarted, 12.3456);
  const std::string line = encodeTracePosition(p);
  CHECK(line == "t 3 2 4711 _allgather_base started 12346");
  const auto back = decodeTracePosition(line);
  REQUIRE(back);
  CHECK(back->rank == 3);
  CHECK(back->group == 2);
  CHECK(back->seq == 4711);
  CHECK(back->op == "_allgather_base");
  CHECK(back->state == TraceState::kStarted);
  CHECK(back->age_s == Approx(12.346));
  for (TraceState s : {TraceState::kPending, TraceState::kFailed, TraceState::kCompleted}) {
    CHECK(decodeTracePosition(encodeTracePosition(row(0, 0, 1, "barrier", s, 0)))->state == s);
  }
  // An op name never carries more than [A-Za-z0-9_] to a terminal.
  CHECK(traceOpName("all\x1b[31m_reduce x") == "all__31m_reduce_x");
  CHECK(traceOpName("") == "unknown");
  CHECK(traceOpName(std::string(100, 'a')).size() == kMaxTraceOpChars);
}

TEST_CASE("Trace positions: forged lines are refused", "[unit][straggler]") {
  for (const char* bad :
       {"t 3 2 4711 all_reduce started", "t 3 2 4711 all_reduce started 5 6", "t -1 0 1 all_reduce started 5",
        "t 0 -2 1 all_reduce started 5", "t 0 0 1 all\x1b_reduce started 5", "t 0 0 1 all_reduce running 5",
        "t 0 0 1 all_reduce started -5", "t 0 0 1 all_reduce started 99999999999999", "x 0 0 1 all_reduce started 5",
        "t 0 0 1e3 all_reduce started 5"}) {
    INFO(bad);
    CHECK_FALSE(decodeTracePosition(bad));
  }
}

TEST_CASE("Progress values: trace positions go with the rings' lines, within the world", "[unit][straggler]") {
  NodeProgress n;
  n.unix_ms = 1700000000000;
  n.threshold_s = 0.5;
  n.ranks.push_back(RankProgress{0, 0, 99, 64, 0.05});
  RankPosition ring;
  ring.rank = 0;
  ring.last_completed_seq = 99;
  ring.last_completed_op = ddprun::FlightOp::kAllReduce;
  ring.last_completed_age_s = 0.3;
  n.positions.push_back(ring);
  n.traces = {row(0, 0, 130, "all_reduce", TraceState::kStarted, 0.8),
              row(0, 1, 7, "all_gather", TraceState::kCompleted, 2.5)};
  const std::string value = encodeNodeProgress(n);
  const auto decoded = decodeNodeProgress(value, 2);
  REQUIRE(decoded);
  CHECK(decoded->rejected == 0);
  CHECK(decoded->progress.ranks.size() == 1);
  CHECK(decoded->progress.positions.size() == 1);
  REQUIRE(decoded->progress.traces.size() == 2);
  CHECK(decoded->progress.traces[0].seq == 130);
  CHECK(decoded->progress.traces[1].op == "all_gather");
  CHECK(decoded->progress.traces[1].state == TraceState::kCompleted);

  // A rank outside the world, or one (rank, group) twice: left out and counted.
  const auto small = decodeNodeProgress(value + "t 5 0 1 all_reduce started 5\nt 0 1 8 all_gather pending 1\n", 2);
  REQUIRE(small);
  CHECK(small->progress.traces.size() == 2);
  CHECK(small->rejected == 2);
}

TEST_CASE("Progress values: an older agent's value reads as before, a newer one as an older decoder reads it",
          "[unit][straggler]") {
  // Written by an agent before trace positions (dp1, a progress line and a ring position).
  const std::string old_value =
      "dp1 1700000000000 500\n"
      "s 0 0 99 64 50000\n"
      "v2 c 0 0 0 99 1 0.300\n";
  const auto old_read = decodeNodeProgress(old_value, 2);
  REQUIRE(old_read);
  CHECK(old_read->rejected == 0);
  CHECK(old_read->progress.ranks.size() == 1);
  CHECK(old_read->progress.positions.size() == 1);
  CHECK(old_read->progress.traces.empty());

  // The same progress with a trace position, from this agent: the older lines unchanged, in the
  // same order, with the trace line after them.
  NodeProgress n = old_read->progress;
  n.traces = {row(0, 0, 130, "all_reduce", TraceState::kStarted, 0.8)};
  const std::string new_value = encodeNodeProgress(n);
  CHECK(new_value.rfind(old_value, 0) == 0);
  // An older decoder keeps the header's "dp1" and reads any line not "s ..." as a ring position
  // (decodePosition), so the trace line is one it leaves out and counts; the rest it reads as before.
  const auto lines = linesOf(new_value);
  REQUIRE(lines.size() == 4);
  CHECK(lines[3].rfind("s ", 0) != 0);
  CHECK_FALSE(decodePosition(lines[3]));
}
