// The job board (rendezvous/board/job_board.h): what agents post beside the rounds, records for
// `ddprun status` and hang summaries, on nodes run as threads on a manual clock
// (tests/rendezvous/manual_job.h).
#include "rendezvous/board/job_board.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <future>
#include <string>
#include <vector>

#include "tests/rendezvous/manual_job.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;
using namespace std::chrono_literals;

namespace {

AgentRecord record(const std::string& state, int round) {
  AgentRecord r;
  r.state = state;
  r.round = round;
  r.nproc = kNproc;
  r.max_restarts = 3;
  return r;
}

}  // namespace

TEST_CASE("job board: a published record is what ddprun status reads, filled in with this node and listed once",
          "[rdzv]") {
  Job job(1, 1);
  Node& a = job.add("a:1");
  a.board().publishStatus(record("joining", -1));
  a.board().publishStatus(record("running", 0));
  const JobStatus status = readJobStatus(job.store(), "job");
  REQUIRE(status.agents.size() == 1);
  const AgentRecord& r = status.agents[0];
  CHECK(r.node == "a:1");
  CHECK(r.state == "running");
  CHECK(r.round == 0);
  CHECK(r.max_restarts == 3);
  CHECK(r.keep_alive_ms == std::chrono::milliseconds(kKeepAlive).count());
  CHECK(r.keep_alive_max_attempt == kMaxMisses);
  CHECK(r.heartbeat_ms > 0);
  CHECK(job.get("agents") == "a:1\n");
}

TEST_CASE("job board: the rendezvous' watcher rewrites the record at every keep-alive while a round runs", "[rdzv]") {
  Job job(1, 1);
  Node& a = job.add("a:1");
  form(job, {&a});
  a.board().publishStatus(record("running", 0));
  a.watch();
  for (int i = 0; i < 3; ++i) {
    REQUIRE(job.clock.awaitSleepers(1));  // the watcher waits out a keep-alive interval
    REQUIRE(job.store().deleteKey("rdzv/job/agents/a:1"));
    job.clock.advance(kKeepAlive);
    REQUIRE(job.clock.awaitSleepers(1));
    REQUIRE(job.has("agents/a:1"));
    CHECK(decodeAgentRecord(job.get("agents/a:1")).state == "running");
  }
}

TEST_CASE("job board: a status write that stalls holds up neither a round forming nor the node's keep-alives",
          "[rdzv]") {
  Job job(2, 2);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  a.faults().add(Fault::delayBy(1h).only(StoreOp::kSet).matching("rdzv/job/agents/a:1"));
  auto stalled = std::async(std::launch::async, [&] { a.board().publishStatus(record("joining", -1)); });
  REQUIRE(job.clock.awaitSleepers(1));  // the write waits out its delay
  auto fa = a.nextRound();
  auto fb = b.nextRound();
  CHECK(fa.get().group_world_size == 2);
  CHECK(fb.get().group_world_size == 2);
  a.watch();
  b.watch();
  // Well past keep_alive_max_attempt intervals: a's keep-alives go on, so b evicts nobody.
  for (int i = 0; i < 2 * kMaxMisses; ++i) job.advance(3, kKeepAlive);
  CHECK_FALSE(job.has("r0/end"));
  CHECK_FALSE(b.hasEvent());
  a.rdzv().stopWatching();
  b.rdzv().stopWatching();
  job.advance(1, 1h);
  REQUIRE(stalled.wait_for(kGuard) == std::future_status::ready);
  CHECK(decodeAgentRecord(job.get("agents/a:1")).state == "joining");
}

TEST_CASE("job board: a node judging a hang gathers the other nodes' summaries through the round's keys", "[rdzv]") {
  Job job(3, 3);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  Node& c = job.add("c:3");
  form(job, {&a, &b, &c});
  CHECK_FALSE(b.board().hangSummaryRequested());
  Call<std::vector<std::string>> gathered(
      a.rdzv(), std::async(std::launch::async, [&] { return a.board().gatherHangSummaries(5s); }));
  // a has asked and found no answer yet: it waits on the clock between looks.
  REQUIRE(job.clock.awaitSleepers(1));
  CHECK(job.get("r0/hang/request") == "a:1");
  CHECK_FALSE(a.board().hangSummaryRequested());  // the asking node does not answer itself
  REQUIRE(b.board().hangSummaryRequested());
  b.board().publishHangSummary("v1 2 0 4 2 3.000\n");
  CHECK_FALSE(b.board().hangSummaryRequested());  // once per round
  REQUIRE(c.board().hangSummaryRequested());
  c.board().publishHangSummary("v1 4 0 5 2 1.000\n");
  job.clock.advance(100ms);
  auto answers = gathered.get();
  std::sort(answers.begin(), answers.end());
  CHECK(answers == std::vector<std::string>{"v1 2 0 4 2 3.000\n", "v1 4 0 5 2 1.000\n"});
}

TEST_CASE("job board: two nodes judging a hang at once each get the other's summary", "[rdzv]") {
  Job job(2, 2);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  form(job, {&a, &b});
  // Each posts its own summary as it asks: neither answers the other's request then.
  Call<std::vector<std::string>> from_a(
      a.rdzv(), std::async(std::launch::async, [&] { return a.board().gatherHangSummaries(5s, "fr1 n a:1\n"); }));
  REQUIRE(job.clock.awaitSleepers(1));
  Call<std::vector<std::string>> from_b(
      b.rdzv(), std::async(std::launch::async, [&] { return b.board().gatherHangSummaries(5s, "fr1 n b:2\n"); }));
  CHECK(from_b.get() == std::vector<std::string>{"fr1 n a:1\n"});
  CHECK_FALSE(b.board().hangSummaryRequested());
  job.clock.advance(100ms);
  CHECK(from_a.get() == std::vector<std::string>{"fr1 n b:2\n"});
}

TEST_CASE("job board: a hang verdict waits a bounded time for nodes that do not answer", "[rdzv]") {
  Job job(2, 2);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  form(job, {&a, &b});
  Call<std::vector<std::string>> gathered(
      a.rdzv(), std::async(std::launch::async, [&] { return a.board().gatherHangSummaries(1s); }));
  // b never answers: a gives up after its wait, with nothing.
  for (int i = 0; i < 10; ++i) job.advance(1, 100ms);
  CHECK(gathered.get().empty());
}

TEST_CASE(
    "job board: a hang summary past a megabyte is cut at a line, and the judge reads only the nodes that answered",
    "[rdzv]") {
  Job job(3, 3);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  Node& c = job.add("c:3");
  form(job, {&a, &b, &c});
  Call<std::vector<std::string>> gathered(
      a.rdzv(), std::async(std::launch::async, [&] { return a.board().gatherHangSummaries(1s); }));
  REQUIRE(job.clock.awaitSleepers(1));
  const std::string line(999, 'x');
  std::string huge;
  while (huge.size() <= (1u << 20)) huge += line + "\n";  // 1,050 lines of 1,000 bytes
  REQUIRE(b.board().hangSummaryRequested());
  b.board().publishHangSummary(huge);
  // b named itself in the round's list of answers; c never answers.
  CHECK(job.get("r0/hang/answered") == "1\n");
  for (int i = 0; i < 10; ++i) job.advance(1, 100ms);
  const auto answers = gathered.get();
  REQUIRE(answers.size() == 1);
  CHECK(answers[0].size() == 1048 * 1000);  // the whole lines that fit in 1 MiB
  CHECK(answers[0] == huge.substr(0, answers[0].size()));
}
