// The end reasons of a round as they are stored (rendezvous/PROTOCOL.md): the text of
// every kind, round trips, and text that is not an end reason.
#include "rendezvous/rounds/round_end.h"

#include <catch2/catch.hpp>

using ddprun::rendezvous::RoundEnd;
using Kind = RoundEnd::Kind;

TEST_CASE("round end: each kind has the text PROTOCOL.md gives it", "[round_end]") {
  CHECK(RoundEnd::done().format() == "done");
  CHECK(RoundEnd::failure("host:12").format() == "fail:host:12");
  CHECK(RoundEnd::finalFailure("host:12").format() == "final:host:12");
  CHECK(RoundEnd::abort("host:12", "SIGTERM").format() == "abort:host:12:SIGTERM");
  CHECK(RoundEnd::join("host:12").format() == "join:host:12");
  CHECK(RoundEnd::evict("host:12").format() == "evict:host:12");
}

TEST_CASE("round end: parse reads back what format wrote", "[round_end]") {
  for (const RoundEnd& end : {RoundEnd::done(), RoundEnd::failure("a:1"), RoundEnd::finalFailure("node-7.cluster:4242"),
                              RoundEnd::abort("a:1", "SIGINT"), RoundEnd::abort("[::1]:9", "SIGKILL"),
                              RoundEnd::join("b"), RoundEnd::evict("c:3")}) {
    const auto parsed = RoundEnd::parse(end.format());
    REQUIRE(parsed);
    CHECK(*parsed == end);
    CHECK(parsed->format() == end.format());
  }
}

TEST_CASE("round end: the node of an abort is everything up to the last colon", "[round_end]") {
  const auto end = RoundEnd::parse("abort:gpu-3:777:SIGTERM");
  REQUIRE(end);
  CHECK(end->kind == Kind::kAbort);
  CHECK(end->node == "gpu-3:777");
  CHECK(end->signal == "SIGTERM");
}

TEST_CASE("round end: text that is not an end reason parses to nothing", "[round_end]") {
  for (const char* text : {"", "done:", "done ", "Done", "fail", "fail:", "final:", "join:", "evict:", "abort:",
                           "abort:node", "abort::SIGTERM", "abort:node:", "restart:a:1", "failed:a", " fail:a"}) {
    INFO(text);
    CHECK_FALSE(RoundEnd::parse(text));
  }
}

TEST_CASE("round end: which ends use a restart or end the job or fail it", "[round_end]") {
  struct Row {
    RoundEnd end;
    bool uses_restart, ends_job, fails_job;
  };
  for (const Row& row :
       {Row{RoundEnd::done(), false, true, false}, Row{RoundEnd::failure("a"), true, false, false},
        Row{RoundEnd::finalFailure("a"), false, true, true}, Row{RoundEnd::abort("a", "SIGTERM"), false, true, true},
        Row{RoundEnd::join("a"), false, false, false}, Row{RoundEnd::evict("a"), false, false, false}}) {
    INFO(row.end.format());
    CHECK(row.end.usesRestart() == row.uses_restart);
    CHECK(row.end.endsJob() == row.ends_job);
    CHECK(row.end.failsJob() == row.fails_job);
  }
}
