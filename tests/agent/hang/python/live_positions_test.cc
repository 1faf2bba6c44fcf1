// Each rank's current collective from torch's live trace (agent/hang/python/live_positions.h):
// a trace reduced to a row per group (empty, all completed, pending, started, failed, several
// groups, point-to-point left out), the handlers a periodic read asks, and the reader against a
// stand-in worker server on a Unix socket: its handler list asked once however many reads,
// a server without a trace handler never asked again, one that gives no trace warned about once.
#include <sys/socket.h>

#include <chrono>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>

#include "agent/hang/python/live_positions.h"
#include "agent/hang/python/worker_server.h"
#include "tests/support/agent_log.h"
#include "tests/support/stand_in_server.h"
#include "tests/support/test_process.h"

using namespace ddprun::agent;
using ddprun::testing::AgentLog;
using ddprun::testing::TempDir;

namespace {

constexpr int64_t kNow = int64_t{1764392000} * 1000000000;  // the reading, CLOCK_REALTIME ns
constexpr int64_t kSecond = 1000000000;

FlightEntry entry(const std::string& pg, int64_t seq, const std::string& profiling_name, FlightEntryState state,
                  int64_t created_ago_s) {
  FlightEntry e;
  e.pg_name = pg;
  e.pg_id = 7;
  e.collective_seq_id = seq;
  e.profiling_name = profiling_name;
  parseProfilingName(e);
  e.is_p2p = e.op == "send" || e.op == "recv";
  e.state = state;
  e.time_created_ns = kNow - created_ago_s * kSecond;
  e.timeout_ms = 600000;
  return e;
}

FlightDump dumpOf(int rank, std::vector<FlightEntry> entries) {
  FlightDump d;
  d.rank = rank;
  d.version = "2.10";
  d.entries = std::move(entries);
  return d;
}

std::string rowText(const TracePosition& p) {
  return std::to_string(p.rank) + " g" + std::to_string(p.group) + " #" + std::to_string(p.seq) + " " + p.op + " " +
         traceStateName(p.state) + " " + std::to_string(p.age_s);
}

}  // namespace

TEST_CASE("Live positions: a trace without collective entries gives no row", "[unit]") {
  CHECK(tracePositions(dumpOf(3, {}), kNow).empty());
  // Point-to-point entries only: a collective's row is what the rings show too.
  FlightEntry send = entry("0", 0, "nccl:send 0->1", FlightEntryState::kStarted, 1);
  CHECK(tracePositions(dumpOf(3, {send}), kNow).empty());
}

TEST_CASE("Live positions: all completed gives the last completed, aged from its completion", "[unit]") {
  FlightEntry first = entry("0", 41, "nccl:all_reduce", FlightEntryState::kCompleted, 9);
  first.time_completed_ns = kNow - 8 * kSecond;
  FlightEntry last = entry("0", 42, "nccl:_allgather_base", FlightEntryState::kCompleted, 5);
  last.time_started_ns = kNow - 5 * kSecond;
  last.time_completed_ns = kNow - 2 * kSecond;
  const auto rows = tracePositions(dumpOf(3, {first, last}), kNow);
  REQUIRE(rows.size() == 1);
  INFO(rowText(rows[0]));
  CHECK(rows[0].rank == 3);
  CHECK(rows[0].group == 0);
  CHECK(rows[0].seq == 42);
  CHECK(rows[0].op == "_allgather_base");
  CHECK(rows[0].state == TraceState::kCompleted);
  CHECK(rows[0].age_s == Approx(2.0));
}

TEST_CASE("Live positions: the oldest entry not completed, pending or started, with its age", "[unit]") {
  FlightEntry done = entry("0", 6, "nccl:all_reduce", FlightEntryState::kCompleted, 20);
  done.time_completed_ns = kNow - 19 * kSecond;
  // DDP's buckets: #7 enqueued 12 s ago and seen started 11 s ago, #8 enqueued behind it.
  FlightEntry held = entry("0", 7, "nccl:all_reduce", FlightEntryState::kStarted, 12);
  held.time_started_ns = kNow - 11 * kSecond;
  FlightEntry behind = entry("0", 8, "nccl:all_reduce", FlightEntryState::kScheduled, 3);
  auto rows = tracePositions(dumpOf(1, {done, held, behind}), kNow);
  REQUIRE(rows.size() == 1);
  INFO(rowText(rows[0]));
  CHECK(rows[0].seq == 7);
  CHECK(rows[0].state == TraceState::kStarted);
  CHECK(rows[0].age_s == Approx(11.0));

  // Not seen started (torch's timing off): pending since it was enqueued.
  rows = tracePositions(dumpOf(1, {done, behind}), kNow);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].seq == 8);
  CHECK(rows[0].state == TraceState::kPending);
  CHECK(rows[0].age_s == Approx(3.0));
}

TEST_CASE("Live positions: an entry not completed past its own timeout is failed", "[unit]") {
  FlightEntry late = entry("0", 12, "gloo:broadcast", FlightEntryState::kStarted, 400);
  late.time_started_ns = kNow - 399 * kSecond;
  late.timeout_ms = 300000;
  auto rows = tracePositions(dumpOf(0, {late}), kNow);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].op == "broadcast");
  CHECK(rows[0].state == TraceState::kFailed);
  CHECK(rows[0].age_s == Approx(399.0));
  // Within its timeout it is only started; without one (0) never failed.
  late.timeout_ms = 500000;
  CHECK(tracePositions(dumpOf(0, {late}), kNow)[0].state == TraceState::kStarted);
  late.timeout_ms = 0;
  CHECK(tracePositions(dumpOf(0, {late}), kNow)[0].state == TraceState::kStarted);
}

TEST_CASE("Live positions: a row per group, by the group's number or else its id, p2p left out", "[unit]") {
  FlightEntry g0 = entry("0", 30, "nccl:all_reduce", FlightEntryState::kCompleted, 4);
  g0.time_completed_ns = kNow - 3 * kSecond;
  FlightEntry g2 = entry("2", 5, "nccl:reduce_scatter_tensor_coalesced", FlightEntryState::kScheduled, 1);
  FlightEntry g2_done = entry("2", 4, "nccl:all_gather", FlightEntryState::kCompleted, 2);
  g2_done.time_completed_ns = kNow - kSecond;
  // A group with a hashed name: its recorder id (7) names it.
  FlightEntry hashed = entry("a3f9c2", 2, "nccl:barrier", FlightEntryState::kCompleted, 6);
  FlightEntry recv = entry("0", 30, "nccl:recv 1<-0", FlightEntryState::kStarted, 1);
  const auto rows = tracePositions(dumpOf(5, {g0, g2_done, hashed, recv, g2}), kNow);
  std::string all;
  for (const auto& r : rows) all += rowText(r) + "\n";
  INFO(all);
  REQUIRE(rows.size() == 3);
  CHECK((rows[0].group == 0 && rows[0].seq == 30 && rows[0].state == TraceState::kCompleted));
  CHECK((rows[1].group == 2 && rows[1].seq == 5 && rows[1].op == "reduce_scatter_tensor_coalesced" &&
         rows[1].state == TraceState::kPending));
  CHECK((rows[2].group == 7 && rows[2].op == "barrier" && rows[2].age_s == Approx(6.0)));
  for (const auto& r : rows) CHECK(r.rank == 5);
}

TEST_CASE("Live positions: a periodic read asks the JSON handlers listed, else the pickle", "[unit]") {
  using V = std::vector<std::string>;
  CHECK(periodicTraceHandlers(V{"dump_traceback", "ping"}).empty());  // torch 2.6's CPU build
  CHECK(periodicTraceHandlers(V{"dump_traceback", "fr_trace_json", "ping"}) == V{"fr_trace_json"});
  CHECK(periodicTraceHandlers(V{"dump_nccl_trace_pickle", "dump_nccl_trace_json", "fr_trace_json"}) ==
        V{"fr_trace_json", "dump_nccl_trace_json"});
  CHECK(periodicTraceHandlers(V{"dump_nccl_trace_pickle", "ping"}) == V{"dump_nccl_trace_pickle"});
}

namespace {

// A stand-in worker server on `path` answering GET /handler/ with `handlers` and
// POST /handler/fr_trace_json with `trace` ("" : takes the connection and never answers), one
// connection at a time on a thread; counts the requests by their first line.
class CountingServer {
 public:
  CountingServer(const std::string& path, std::string handlers, std::string trace)
      : handlers_(std::move(handlers)),
        trace_(std::move(trace)),
        server_(path, [this](int c, const std::string& line) { answer(c, line); }) {}
  int count(const std::string& line) {
    std::lock_guard<std::mutex> lock(mutex_);
    return counts_[line];
  }

 private:
  void answer(int c, const std::string& line) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++counts_[line];
    }
    const std::string body = line == "GET /handler/" ? handlers_ : line == "POST /handler/fr_trace_json" ? trace_ : "";
    if (body.empty()) {
      // No answer: wait for the client to give up (its end closes) or the server to stop.
      server_.readable(c);
      return;
    }
    const std::string reply = "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    (void)::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
  }

  std::string handlers_;
  std::string trace_;
  std::mutex mutex_;
  std::map<std::string, int> counts_;
  ddprun::testing::StandInServer server_;  // last: its thread answers with the members above
};

// One period of the progress watch: start, wait for the reads (bounded), take.
std::vector<TracePosition> readPeriod(LiveTraceReader& reader, const std::vector<LiveTraceReader::Source>& sources) {
  reader.start(sources);
  REQUIRE(reader.waitIdle(std::chrono::seconds(20)));  // each read is bounded far below this
  CHECK_FALSE(reader.busy());
  return reader.take(kNow);
}

// torch 2.11's fr_trace_json (FlightRecorder::dump_json) of one rank waiting in all_reduce #2.
std::string traceJson() {
  const std::string created = std::to_string(kNow - 3 * kSecond);
  return R"({"version":"2.10","pg_config":{"0":{"name":"0","desc":"default_pg","ranks":"[0, 1]"}},"entries":[)"
         R"({"record_id":0,"pg_id":0,"process_group":["0","default_pg"],"collective_seq_id":2,"p2p_seq_id":0,)"
         R"("op_id":2,"profiling_name":"gloo:all_reduce","time_created_ns":)" +
         created +
         R"(,"state":"scheduled","time_discovered_started_ns":0,"time_discovered_completed_ns":0,)"
         R"("timeout_ms":300000,"is_p2p":false}]})";
}

}  // namespace

TEST_CASE("Live trace reader: the handler list once per worker, its trace every read", "[unit]") {
  TempDir dir;
  const pid_t pid = 4242;
  CountingServer server(workerServerSocket(dir.path(), pid), R"(["dump_traceback","fr_trace_json","ping"])",
                        traceJson());
  LiveTraceReader reader;
  AgentLog log{AgentLog::kOwnLevel};
  for (int period = 0; period < 3; ++period) {
    const auto rows = readPeriod(reader, {{dir.path(), pid, 1}});
    REQUIRE(rows.size() == 1);
    CHECK(rows[0].rank == 1);
    CHECK(rows[0].seq == 2);
    CHECK(rows[0].op == "all_reduce");
    CHECK(rows[0].state == TraceState::kPending);
    CHECK(rows[0].age_s == Approx(3.0));
  }
  CHECK(server.count("GET /handler/") == 1);
  CHECK(server.count("POST /handler/fr_trace_json") == 3);
  CHECK(log.text().empty());
}

TEST_CASE("Live trace reader: a server without a trace handler is listed once, never asked again", "[unit]") {
  TempDir dir;
  const pid_t pid = 4243;
  // torch 2.6's CPU build.
  CountingServer server(workerServerSocket(dir.path(), pid), R"(["dump_traceback","ping"])", traceJson());
  LiveTraceReader reader;
  for (int period = 0; period < 3; ++period) CHECK(readPeriod(reader, {{dir.path(), pid, 0}}).empty());
  // After the first read nothing runs: start() begins no read.
  reader.start({{dir.path(), pid, 0}});
  CHECK_FALSE(reader.busy());
  CHECK(server.count("GET /handler/") == 1);
  CHECK(server.count("POST /handler/fr_trace_json") == 0);
  // No socket (torch 1.13): no read at all.
  reader.start({{dir.path(), pid + 1, 2}});
  CHECK_FALSE(reader.busy());
}

TEST_CASE("Live trace reader: a server that gives no trace in time is one warning, once", "[integration]") {
  TempDir dir;
  const pid_t pid = 4244;
  CountingServer server(workerServerSocket(dir.path(), pid), R"(["fr_trace_json"])", /*trace: never answers*/ "");
  LiveTraceReader reader(WorkerServerLimits{std::chrono::milliseconds(200), size_t{1} << 20});
  AgentLog log{AgentLog::kOwnLevel};
  for (int period = 0; period < 3; ++period) CHECK(readPeriod(reader, {{dir.path(), pid, 1}}).empty());
  INFO(log.text());
  CHECK(server.count("POST /handler/fr_trace_json") == 3);
  std::istringstream lines(log.text());
  int warnings = 0;
  for (std::string line; std::getline(lines, line);) warnings += line.rfind("warning: ", 0) == 0;
  CHECK(warnings == 1);
  CHECK_THAT(log.text(), Catch::Contains("no whole answer within 200 ms; `ddprun status --trace` shows rank 1 from "
                                         "ddprun's rings"));
}
