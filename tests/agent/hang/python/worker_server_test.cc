// torch's worker server asked by the agent (agent/hang/python/worker_server.h, live_trace.h,
// worker_server_stacks.h), against a stand-in server on a Unix socket: one that never answers
// (bounded by the timeout, one problem line), one that answers 1 GiB (cut at the bound, the
// rest never read), and one that serves a torch 2.11-shaped fr_trace_json (written from
// torch's FlightRecorder::dump_json: string ranks, 0 for "not yet", no frames), which the
// dumps' verdict then judges as it judges dump files.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <map>
#include <thread>

#include <catch2/catch.hpp>

#include "agent/hang/python/live_trace.h"
#include "agent/hang/python/live_traces.h"
#include "agent/hang/python/worker_server.h"
#include "agent/hang/python/worker_server_stacks.h"
#include "agent/torch_trace/dump_verdict.h"
#include "agent/torch_trace/flight_json.h"
#include "agent/torch_trace/torch_dumps.h"
#include "tests/support/agent_log.h"
#include "tests/support/stand_in_server.h"
#include "tests/support/test_process.h"

using namespace ddprun::agent;
using ddprun::testing::AgentLog;
using ddprun::testing::TempDir;

namespace {

// A stand-in for torch's _WorkerServer on `path`, one connection at a time, on a thread.
class FakeServer {
 public:
  enum class Mode { kNeverAnswers, kHuge, kRoutes };
  FakeServer(const std::string& path, Mode mode, std::map<std::string, std::string> routes = {})
      : mode_(mode),
        routes_(std::move(routes)),
        server_(path, [this](int c, const std::string& line) { answer(c, line); }) {}
  uint64_t bytesSent() const { return sent_; }

 private:
  bool send(int c, const std::string& bytes) {
    const ssize_t n = ::send(c, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) sent_ += static_cast<uint64_t>(n);
    return n == static_cast<ssize_t>(bytes.size());
  }
  void answer(int c, const std::string& line) {
    if (mode_ == Mode::kNeverAnswers) {
      server_.readable(-1);  // until the server stops
      return;
    }
    if (mode_ == Mode::kHuge) {
      if (!send(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1073741824\r\n\r\n")) return;
      const std::string chunk(64 * 1024, 'x');
      for (uint64_t left = uint64_t{1} << 30; left > 0 && !server_.stopped(); left -= chunk.size()) {
        if (!send(c, chunk)) return;  // the client closed: it stopped reading
      }
      return;
    }
    auto route = routes_.find(line);
    const std::string body = route == routes_.end() ? "Handler not found" : route->second;
    send(c, std::string(route == routes_.end() ? "HTTP/1.1 404 Not Found" : "HTTP/1.1 200 OK") +
                "\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  }

  Mode mode_;
  std::map<std::string, std::string> routes_;
  std::atomic<uint64_t> sent_{0};
  ddprun::testing::StandInServer server_;  // last: its thread answers with the members above
};

// torch 2.11's fr_trace_json for a gloo job of two ranks (FlightRecorder::dump_json): rank 0
// completed all_reduce #1 and waits in #2; rank 1 completed #1 only.
std::string frTraceJson(bool second) {
  std::string entries =
      R"({"record_id":0,"pg_id":0,"process_group":["0","default_pg"],"collective_seq_id":1,"p2p_seq_id":0,)"
      R"("op_id":1,"profiling_name":"gloo:all_reduce","time_created_ns":1764392000000000000,)"
      R"("input_sizes":[[4]],"input_dtypes":["Float"],"output_sizes":[[4]],"output_dtypes":["Float"],)"
      R"("state":"completed","time_discovered_started_ns":1764392000000100000,)"
      R"("time_discovered_completed_ns":1764392000000200000,"retired":true,"timeout_ms":300000,"is_p2p":false})";
  if (second) {
    entries += R"(,{"record_id":1,"pg_id":0,"process_group":["0","default_pg"],"collective_seq_id":2,"p2p_seq_id":0,)"
               R"("op_id":2,"profiling_name":"gloo:all_reduce","time_created_ns":1764392001000000000,)"
               R"("input_sizes":[[4]],"input_dtypes":["Float"],"output_sizes":[[4]],"output_dtypes":["Float"],)"
               R"("state":"started","time_discovered_started_ns":1764392001000100000,)"
               R"("time_discovered_completed_ns":0,"retired":false,"timeout_ms":300000,"is_p2p":false})";
  }
  return R"({"version":"2.10","pg_config":{"0":{"name":"0","desc":"default_pg","ranks":"[0, 1]"}},)"
         R"("pg_status":{"0":{"last_enqueued_collective":")" +
         std::string(second ? "2" : "1") + R"(","last_started_collective":")" + (second ? "2" : "1") +
         R"(","last_completed_collective":"1"}},"entries":[)" + entries + "]}";
}

// torch 2.11's handler names (Handlers.cpp, PythonHandlers.cpp; no NCCL on a CPU build).
const char* const kHandlers211 =
    R"(["dump_traceback","fr_dump_file","fr_trace_json","ping","pyspy_dump","wait_counter_values"])";

}  // namespace

// A real timeout on a real socket (the client's poll() deadline): integration, not unit.
TEST_CASE("Worker server: one that never answers costs the timeout and one problem line, no more", "[integration]") {
  TempDir dir;
  const std::string socket = workerServerSocket(dir.path(), 4242);
  FakeServer server(socket, FakeServer::Mode::kNeverAnswers);
  const WorkerServerReply reply =
      askWorkerServer(socket, "POST", "/handler/dump_traceback", {std::chrono::milliseconds(300), 1 << 20});
  CHECK(reply.status == 0);
  CHECK(reply.body.empty());
  CHECK_FALSE(reply.ok());
  CHECK(reply.problem ==
        "torch's worker server " + socket + " (POST /handler/dump_traceback): no whole answer within 300 ms");
}

TEST_CASE("Worker server: a 1 GiB answer is cut at the bound and the rest is never read", "[unit]") {
  TempDir dir;
  const std::string socket = workerServerSocket(dir.path(), 4243);
  FakeServer server(socket, FakeServer::Mode::kHuge);
  const WorkerServerReply reply =
      askWorkerServer(socket, "POST", "/handler/fr_trace_json", {std::chrono::seconds(30), size_t{1} << 20});
  CHECK(reply.status == 200);
  CHECK(reply.cut);
  CHECK(reply.body.size() == size_t{1} << 20);
  CHECK(reply.problem == "torch's worker server " + socket +
                             " (POST /handler/fr_trace_json): the answer is longer than 1 MiB; cut there");
  // The client closed the socket: the server's sending stopped far short of its 1 GiB.
  CHECK(server.bytesSent() < (uint64_t{1} << 30));
}

// The silent server's ask ends at kWorkerServerStacksWait (1 s) of real time: integration.
TEST_CASE("Worker server: stacks come from dump_traceback, and a server that never answers is one warning",
          "[integration]") {
  TempDir dir;
  TempDir other;
  const std::string dump =
      "Current thread 0x00007f30132126c0 (most recent call first):\n  <no Python frame>\n\n"
      "Thread 0x00007f3046cfb780 (most recent call first):\n"
      "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 2806 in all_reduce\n"
      "  File \"/job/train.py\", line 12 in <module>\n";
  FakeServer answering(workerServerSocket(dir.path(), 100), FakeServer::Mode::kRoutes,
                       {{"POST /handler/dump_traceback", dump}});
  FakeServer silent(workerServerSocket(other.path(), 101), FakeServer::Mode::kNeverAnswers);
  AgentLog warnings{AgentLog::kOwnLevel};
  const auto start = std::chrono::steady_clock::now();
  const std::vector<ServerStacks> stacks = askWorkerServersForStacks(
      {{dir.path(), 100}, {other.path(), 101}, {dir.path(), 102}}, [&](std::chrono::milliseconds step) {
        std::this_thread::sleep_for(step);
        return std::chrono::steady_clock::now() - start;
      });
  REQUIRE(stacks.size() == 3);
  CHECK(stacks[0].stacks == dump);
  CHECK(stacks[0].socket == workerServerSocket(dir.path(), 100));
  CHECK(stacks[1].stacks.empty());
  CHECK(stacks[2].stacks.empty());  // no server: left to the signal, without a word
  CHECK(stacks[2].socket.empty());
  const std::vector<std::string> lines = warnings.lines();
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Catch::StartsWith("warning: torch's worker server " + workerServerSocket(other.path(), 101) +
                                         " (POST /handler/dump_traceback): no whole answer within 1000 ms"));
}

TEST_CASE("Worker server: a torch 2.11 fr_trace_json live trace is read and judged like dump files", "[unit]") {
  TempDir dir;
  const std::string s0 = workerServerSocket(dir.path(), 200);
  const std::string s1 = workerServerSocket(dir.path(), 201);
  FakeServer rank0(s0, FakeServer::Mode::kRoutes,
                   {{"GET /handler/", kHandlers211}, {"POST /handler/fr_trace_json", frTraceJson(true)}});
  FakeServer rank1(s1, FakeServer::Mode::kRoutes,
                   {{"GET /handler/", kHandlers211}, {"POST /handler/fr_trace_json", frTraceJson(false)}});
  const LiveTrace t0 = fetchLiveTrace(s0, 0);
  const LiveTrace t1 = fetchLiveTrace(s1, 1);
  INFO(t0.problem << t1.problem);
  REQUIRE(t0.dump);
  REQUIRE(t1.dump);
  CHECK(t0.handler == "fr_trace_json");
  CHECK(t0.dump->version == "2.10");
  REQUIRE(t0.dump->groups.size() == 1);
  CHECK(t0.dump->groups[0].ranks == std::vector<int>{0, 1});
  REQUIRE(t0.dump->entries.size() == 2);
  const FlightEntry& waiting = t0.dump->entries[1];
  CHECK(waiting.op == "all_reduce");
  CHECK(waiting.collective_seq_id == 2);
  CHECK(waiting.state == FlightEntryState::kStarted);
  CHECK_FALSE(waiting.time_completed_ns);  // 0 is "not yet"
  CHECK(waiting.input_sizes == std::vector<std::vector<int64_t>>{{4}});
  CHECK(waiting.input_dtypes == std::vector<std::string>{"Float"});
  const DumpVerdict verdict = dumpVerdict({*t0.dump, *t1.dump});
  CHECK(verdict.culprits == std::vector<int>{1});
  CHECK_THAT(verdict.text(), Catch::Contains("rank 1"));
}

TEST_CASE("Worker server: torch 2.6's server has no trace handler, and a trace that is not one is named", "[unit]") {
  TempDir dir;
  const std::string s26 = workerServerSocket(dir.path(), 300);
  FakeServer torch26(s26, FakeServer::Mode::kRoutes, {{"GET /handler/", R"(["dump_traceback","ping"])"}});
  const LiveTrace none = fetchLiveTrace(s26, 0);
  CHECK_FALSE(none.dump);
  CHECK(none.problem.empty());
  const std::string bad = workerServerSocket(dir.path(), 301);
  FakeServer broken(bad, FakeServer::Mode::kRoutes,
                    {{"GET /handler/", kHandlers211}, {"POST /handler/fr_trace_json", R"({"entries":[]})"}});
  const LiveTrace unreadable = fetchLiveTrace(bad, 0);
  CHECK_FALSE(unreadable.dump);
  CHECK_THAT(unreadable.problem, Catch::Contains("no 'version': not a flight-recorder trace"));
  CHECK_THROWS_WITH(parseFlightDumpJson("[1,", "t", 0), Catch::Contains("t: not readable JSON"));
}

TEST_CASE("Live traces: a rank without a dump file is judged from its live trace, a rank with one from its file",
          "[unit]") {
  TempDir dir;
  std::ofstream(dir.file("dump1")) << "not a dump";
  TorchDumps files({ExpectedDump{0, dir.file("dump0"), {}}, ExpectedDump{1, dir.file("dump1"), stampOf("")}});
  files.poll();
  files.poll();  // rank 1's file held its size: read, and found unreadable
  files.waitForReads(std::chrono::seconds(5));
  REQUIRE(files.missing() == std::vector<int>{0});
  REQUIRE(files.unreadable().size() == 1);
  const FlightDump t0 = parseFlightDumpJson(frTraceJson(true), "t0", 0);
  const FlightDump t1 = parseFlightDumpJson(frTraceJson(false), "t1", 1);
  const FlightDump other = parseFlightDumpJson(frTraceJson(false), "t5", 5);
  // Both ranks served a trace: neither the missing file nor the unreadable one holds the verdict back.
  NodeDumps both = nodeDumps(&files, {t0, t1, other}, {0, 1});
  CHECK(both.missing.empty());
  CHECK(both.unreadable.empty());
  CHECK(both.live == 2);  // rank 5 is no rank of this node
  REQUIRE(both.dumps.size() == 2);
  CHECK(dumpVerdict(both.dumps).culprits == std::vector<int>{1});
  // Only rank 1's: rank 0 is still missing, rank 1's bad file no longer counts.
  NodeDumps one = nodeDumps(&files, {t1}, {0, 1});
  CHECK(one.missing == std::vector<int>{0});
  CHECK(one.unreadable.empty());
  // No server: the files as before.
  NodeDumps none = nodeDumps(&files, {}, {0, 1});
  CHECK(none.missing == std::vector<int>{0});
  CHECK(none.unreadable.size() == 1);
  CHECK(none.live == 0);
}
