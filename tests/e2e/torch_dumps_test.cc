// ddprun reads torch's flight-recorder dumps when a collective fails, with fake torch workers
// (Python, no torch): each writes a synthetic dump (tests/agent/torch_trace/flight_dumps.py)
// at the prefix ddprun gave it, as torch's watchdog does. Rank 0, which waited, writes its
// dump and dies by SIGABRT with no error file (NCCL's watchdog); rank 1 sleeps and writes its
// dump once rank 0's exists (torch signals the timeout dump through the store). The root cause
// is rank 1 from the dumps; a missing or corrupt dump falls back to the Python stacks with one
// line. stderr is not routed through ddprun, so no stderr line gives the failure away. Across
// two agents on loopback, the node of rank 0 judges with rank 1's dump sent through the
// agents' hang-summary exchange; the health check shows the verdict.
#include <csignal>
#include <fstream>
#include <map>
#include <thread>

#include <catch2/catch.hpp>

#include "tests/agent/torch_trace/dumps_support.h"
#include "tests/e2e/ops_support.h"
#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

// argv: the scenario of flight_dumps.py, whether rank 1 writes its dump, whether rank 0
// aborts after writing its own (else it sleeps too).
std::string writeScript(const TempDir& dir) {
  const std::string path = dir.file("job.py");
  std::ofstream(path) << "import os, subprocess, sys, time\n"
                         "scenario, rank1_writes, rank0_aborts = sys.argv[1], sys.argv[2] == '1', sys.argv[3] == '1'\n"
                         "prefix = os.environ['TORCH_FR_DUMP_TEMP_FILE']\n"
                         "rank = int(os.environ['RANK'])\n"
                         "def write():\n"
                         "    subprocess.run([sys.executable, '"
                      << flightDumpsScript()
                      << "', os.path.dirname(prefix), scenario, '--prefix',\n"
                         "                    os.path.basename(prefix), '--rank', str(rank)], check=True)\n"
                         "if rank == 0:\n"
                         "    time.sleep(1)\n"
                         "    write()\n"
                         "    if rank0_aborts:\n"
                         "        os.abort()\n"
                         "    time.sleep(60)\n"
                         "else:\n"
                         "    deadline = time.time() + 30\n"
                         "    while not os.path.exists(prefix + '0') and time.time() < deadline:\n"
                         "        time.sleep(0.05)\n"
                         "    time.sleep(0.3)\n"
                         "    if rank1_writes:\n"
                         "        write()\n"
                         "    time.sleep(60)\n";
  return path;
}

struct Job {
  RunResult r;
  std::string events;
};

Job runJob(const TempDir& dir, const std::string& scenario, bool rank1_writes, bool rank0_aborts = true) {
  const std::string script = writeScript(dir);
  const std::string events = dir.file("events.jsonl");
  RunResult r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--log_dir=" + dir.file("logs"), script,
                     scenario, rank1_writes ? "1" : "0", rank0_aborts ? "1" : "0"},
                    {{"PYTHON", "/usr/bin/python3"}, {"DDPRUN_EVENTS_FILE", events}}, 90s);
  return Job{std::move(r), fileExists(events) ? readFile(events) : ""};
}

// The report's root cause section: from its heading to the next rule.
std::string rootCause(const std::string& err) {
  const size_t at = err.find("Root cause (first failure):");
  if (at == std::string::npos) return {};
  return err.substr(at, err.find("------", at) - at);
}

}  // namespace

TEST_CASE("a rank that aborts as NCCL's watchdog does: the dumps blame the rank behind", "[e2e][torch_dumps]") {
  TempDir dir;
  Job job = runJob(dir, "behind", true);
  REQUIRE(job.r.finished);
  INFO(job.r.out << job.r.err << job.events);
  CHECK(job.r.exit_code == 1);
  // What first says a collective failed depends on which the agent sees first, rank 0's abort or
  // the dump it wrote just before (under load, the dump: a clean-clone run at load 4): either is
  // right, and the verdict after it is the same.
  CHECK_THAT(job.r.err, Catch::Contains("worker rank 0 (pid ") && Catch::Contains(") was killed by SIGABRT"));
  CHECK_THAT(job.r.err, Catch::Contains("rank 0 was killed by SIGABRT and wrote no error file") ||
                            Catch::Contains("a collective failed (rank 0: wrote torch's flight-recorder dump"));
  CHECK_THAT(job.r.err, Catch::Contains("hang: rank 1 has not called all_reduce #2 of group 0 (default_pg); rank 0 "
                                        "has waited in it for 10.0 s — rank 1 is behind"));
  CHECK_THAT(job.r.err, Catch::Contains("rank 1: behind, last called all_reduce #1 (completed) at /job/train.py:12"));
  CHECK_THAT(job.events, Catch::Contains("\"event\":\"hang_verdict\""));
  CHECK_THAT(job.events, Catch::Contains("\"source\":\"flight_recorder\""));
  const std::string cause = rootCause(job.r.err);
  CHECK_THAT(cause, Catch::Contains("rank      : 1 (local_rank: 1)"));
  CHECK_THAT(cause, Catch::Contains("hang: rank 1 has not called all_reduce #2"));
  // Its Python stack, taken before it was stopped.
  CHECK_THAT(cause, Catch::Contains("job.py\", line"));
}

TEST_CASE("a dump appearing is noticed while every rank still runs", "[e2e][torch_dumps]") {
  TempDir dir;
  Job job = runJob(dir, "behind", true, false);
  REQUIRE(job.r.finished);
  INFO(job.r.out << job.r.err << job.events);
  CHECK(job.r.exit_code == 1);
  CHECK_THAT(job.r.err, Catch::Contains("a collective failed (rank 0: wrote torch's flight-recorder dump "));
  CHECK_THAT(job.events, Catch::Contains("\"source\":\"flight_recorder\""));
  CHECK_THAT(rootCause(job.r.err), Catch::Contains("rank      : 1 (local_rank: 1)"));
}

TEST_CASE("a rank without a dump: the Python stacks judge, and one line names it", "[e2e][torch_dumps]") {
  TempDir dir;
  Job job = runJob(dir, "behind", false);
  REQUIRE(job.r.finished);
  INFO(job.r.out << job.r.err << job.events);
  CHECK(job.r.exit_code == 1);
  CHECK(countOf(job.r.err, "torch flight-recorder dumps: no dump from rank 1 within ") == 1);
  CHECK_THAT(job.r.err, Catch::Contains("the verdict comes from the Python stacks"));
  CHECK_THAT(job.r.err, !Catch::Contains("has not called all_reduce"));
  CHECK_THAT(job.events, !Catch::Contains("\"source\":\"flight_recorder\""));
}

TEST_CASE("a corrupt dump: one line, the Python stacks judge, no crash", "[e2e][torch_dumps]") {
  TempDir dir;
  Job job = runJob(dir, "corrupt", true);
  REQUIRE(job.r.finished);
  INFO(job.r.out << job.r.err << job.events);
  CHECK(job.r.exit_code == 1);
  CHECK(job.r.term_signal == 0);
  CHECK(countOf(job.r.err, "torch flight-recorder dumps: rank 1: ") == 1);
  CHECK_THAT(job.r.err, Catch::Contains("the verdict comes from the Python stacks"));
  CHECK_THAT(job.events, !Catch::Contains("\"source\":\"flight_recorder\""));
}

TEST_CASE("an abort that no dump or stack ties to a collective: the others get the ordinary SIGTERM",
          "[e2e][torch_dumps]") {
  TempDir dir;
  const std::string script = dir.file("abort.py");
  std::ofstream(script) << "import os, signal, sys, time\n"
                           "if os.environ['RANK'] == '0':\n"
                           "    time.sleep(1)\n"
                           "    os.abort()\n"
                           "def term(*_):\n"
                           "    print('rank 1 got SIGTERM', flush=True)\n"
                           "    sys.exit(0)\n"
                           "signal.signal(signal.SIGTERM, term)\n"
                           "time.sleep(60)\n";
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--log_dir=" + dir.file("logs"), script},
               {{"PYTHON", "/usr/bin/python3"}}, 90s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("rank 0 was killed by SIGABRT and wrote no error file"));
  CHECK_THAT(r.err, Catch::Contains("no torch flight-recorder dump from rank 0-1 within"));
  CHECK_THAT(r.out, Catch::Contains("rank 1 got SIGTERM"));
  CHECK_THAT(rootCause(r.err), Catch::Contains("rank      : 0 (local_rank: 0)"));
}

// Issue 44: a 0.46 MB dump (100,000 duplicate keys named by 30,000 entries) took 30 s to
// parse, on the agent's event loop, so a SIGTERM meanwhile went unanswered. Rank 0 writes it
// and aborts as NCCL's watchdog does; SIGTERM comes while the agent gathers the dumps.
TEST_CASE("a dump built to take long to read does not hold up the agent's answer to SIGTERM", "[e2e][torch_dumps]") {
  TempDir dir;
  const std::string marker = dir.file("rank0_dumped");
  const std::string script = dir.file("slow_dump.py");
  std::ofstream(script) << "import os, subprocess, sys, time\n"
                           "prefix = os.environ['TORCH_FR_DUMP_TEMP_FILE']\n"
                           "if os.environ['RANK'] == '0':\n"
                           "    time.sleep(1)\n"
                           "    subprocess.run([sys.executable, '"
                        << flightDumpsScript()
                        << "', os.path.dirname(prefix), 'dup_keys', '--prefix',\n"
                           "                    os.path.basename(prefix), '--rank', '0'], check=True)\n"
                           "    open('"
                        << marker
                        << "', 'w').close()\n"
                           "    os.abort()\n"
                           "time.sleep(60)\n";
  TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=2", "--log_dir=" + dir.file("logs"), script},
                     {{"PYTHON", "/usr/bin/python3"}});
  REQUIRE(eventually([&] { return fileExists(marker); }, 60s));
  // The agent sees rank 0's abort and reads the dump meanwhile.
  std::this_thread::sleep_for(1s);
  ddprun.signal(SIGTERM);
  const auto sent = std::chrono::steady_clock::now();
  REQUIRE(ddprun.wait(90s));
  const auto answered = std::chrono::steady_clock::now() - sent;
  INFO(ddprun.err());
  CHECK(answered < 10s);
  CHECK(ddprun.exitCode() == 128 + SIGTERM);
  CHECK_THAT(ddprun.err(), Catch::Contains("received SIGTERM"));
}

namespace {

// Like writeScript's job, for one worker per node: rank 1 (on the other node, with a dump prefix
// of its own) waits for `marker`, which rank 0 touches once its dump is written, then writes its
// own from a child process while it sleeps (line 18).
std::string writeNodesScript(const TempDir& dir, const std::string& marker, bool rank1_writes = true) {
  const std::string path = dir.file("nodes.py");
  std::ofstream(path) << "import os, subprocess, sys, time\n"
                         "rank1_writes = "
                      << (rank1_writes ? "True" : "False")
                      << "\n"
                         "prefix = os.environ['TORCH_FR_DUMP_TEMP_FILE']\n"
                         "rank = int(os.environ['RANK'])\n"
                         "def write():\n"
                         "    return subprocess.Popen([sys.executable, '"
                      << flightDumpsScript()
                      << "', os.path.dirname(prefix), 'behind', '--prefix',\n"
                         "                             os.path.basename(prefix), '--rank', str(rank)])\n"
                         "if rank == 0:\n"
                         "    time.sleep(1)\n"
                         "    assert write().wait() == 0\n"
                         "    open('"
                      << marker
                      << "', 'w').close()\n"
                         "    os.abort()\n"
                         "deadline = time.time() + 30\n"
                         "while not os.path.exists('"
                      << marker
                      << "') and time.time() < deadline:\n"
                         "    time.sleep(0.05)\n"
                         "time.sleep(0.3)\n"
                         "writer = write() if rank1_writes else None  # in the background: its stack is taken in "
                         "the sleep below\n"
                         "time.sleep(60)\n";
  return path;
}

struct TwoNodes {
  std::string judge;  // the stderr of the agent whose rank 0 aborted
  std::string both;   // both agents' stderr, for a failure's message
  int exit_codes[2] = {-1, -1};
};

// The job of writeNodesScript on two agents of one c10d job on loopback, the first hosting the
// store on a port from the kernel.
TwoNodes runTwoNodes(const TempDir& dir, const std::string& script, const std::string& id) {
  auto args = [&](int port, bool host) {
    return std::vector<std::string>{ddprunPath(),
                                    "--nnodes=2",
                                    "--nproc_per_node=1",
                                    "--rdzv_backend=c10d",
                                    "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
                                    "--rdzv_id=" + id,
                                    std::string("--rdzv_conf=is_host=") + (host ? "true" : "false"),
                                    "--log_dir=" + dir.file(host ? "logs0" : "logs1"),
                                    script};
  };
  const std::map<std::string, std::string> env{{"PYTHON", "/usr/bin/python3"}};
  TestProcess first(args(0, true), env);
  const int port = announcedPort(first);
  REQUIRE(port > 0);
  TestProcess second(args(port, false), env);
  REQUIRE(first.wait(90s));
  REQUIRE(second.wait(90s));
  INFO("first agent:\n" << first.err() << "\nsecond agent:\n" << second.err());
  // The node of rank 0 saw its worker abort; rank 1 runs on the other one.
  TestProcess& judge = first.err().find("(ranks 0-0 of 2,") != std::string::npos ? first : second;
  return TwoNodes{judge.err(),
                  "first agent:\n" + first.err() + "\nsecond agent:\n" + second.err(),
                  {first.exitCode(), second.exitCode()}};
}

}  // namespace

TEST_CASE("two nodes: the node that sees the failure blames the rank behind on the other node, with its frame",
          "[e2e][torch_dumps][multinode]") {
  TempDir dir;
  const TwoNodes job = runTwoNodes(dir, writeNodesScript(dir, dir.file("rank0_dumped")), "dumps-across");
  const std::string& err = job.judge;
  INFO(job.both);
  CHECK(job.exit_codes[0] == 1);
  CHECK(job.exit_codes[1] == 1);
  // What says a collective failed depends on which the agent sees first, rank 0's abort or the
  // dump torch wrote just before it: either is right, and the verdict after it is the same.
  REQUIRE_THAT(err, Catch::Contains("worker rank 0 (pid ") && Catch::Contains(") was killed by SIGABRT"));
  REQUIRE_THAT(err, Catch::Contains("rank 0 was killed by SIGABRT and wrote no error file") ||
                        Catch::Contains("a collective failed (rank 0: wrote torch's flight-recorder dump"));
  CHECK_THAT(err, Catch::Contains("hang: rank 1 has not called all_reduce #2 of group 0 (default_pg); rank 0 has "
                                  "waited in it for 10.0 s — rank 1 is behind"));
  CHECK_THAT(err, Catch::Contains("rank 1: behind, last called all_reduce #1 (completed) at /job/train.py:12 in main"));
  const std::string cause = rootCause(err);
  CHECK_THAT(cause, Catch::Contains("rank      : 1 (local_rank: 0)"));
  CHECK_THAT(cause, Catch::Contains("(a rank of another node; its agent stops it as the round ends)"));
  CHECK_THAT(cause,
             Catch::Contains("where     : behind, last called all_reduce #1 (completed) at /job/train.py:12 in main"));
  CHECK_THAT(cause, Catch::Contains("verdict   : hang: rank 1 has not called all_reduce #2"));
  // Its Python stack, taken by its own node before anyone was stopped: where it sleeps.
  CHECK_THAT(cause, Catch::Contains("python    : (its main thread, taken by its node's agent"));
  // Either of its sleeps after rank 0's abort: the other node may ask for its stacks before its own
  // dump (line 16) or after (line 18); both show it asleep, behind.
  CHECK_THAT(cause, Catch::Contains("nodes.py\", line 18, in <module>\n      time.sleep(60)") ||
                        Catch::Contains("nodes.py\", line 16, in <module>\n      time.sleep(0.3)"));
  CHECK_THAT(cause, !Catch::Contains("rank      : 0 "));
}

TEST_CASE("two nodes: a rank whose node sent no dump is named in one line, and the Python stacks judge",
          "[e2e][torch_dumps][multinode]") {
  TempDir dir;
  const TwoNodes job = runTwoNodes(dir, writeNodesScript(dir, dir.file("rank0_dumped"), false), "dumps-missing");
  const std::string& err = job.judge;
  INFO(job.both);
  CHECK(job.exit_codes[0] == 1);
  CHECK(job.exit_codes[1] == 1);
  REQUIRE_THAT(err, Catch::Contains("rank 0 was killed by SIGABRT and wrote no error file") ||
                        Catch::Contains("a collective failed (rank 0: wrote torch's flight-recorder dump"));
  CHECK(countOf(err,
                "torch flight-recorder dumps: no dump of rank 1 came from the other nodes (this node read rank "
                "0); the verdict comes from the Python stacks") == 1);
  CHECK_THAT(err, !Catch::Contains("has not called all_reduce"));
}

TEST_CASE("the health check shows the attempt's hang verdict and the rank it blames", "[e2e][torch_dumps][ops]") {
  TempDir dir;
  const std::string script = writeScript(dir);
  // Two failures in a row: the node sits out, and its health check answers meanwhile.
  TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=2", "--max_restarts=3", "--node_cooldown=60",
                      "--health_check_port=0", "--health_check_addr=127.0.0.1", "--log_dir=" + dir.file("logs"), script,
                      "behind", "1", "1"},
                     {{"PYTHON", "/usr/bin/python3"}});
  const int port = ops::healthPort(ddprun);
  REQUIRE(port > 0);
  REQUIRE(ddprun.waitForOutput("sits out of the job for 60.0 s", 60s));
  const std::string response = ops::httpGet(port);
  INFO(ddprun.err() << response);
  CHECK(response.rfind("HTTP/1.1 503", 0) == 0);
  CHECK_THAT(response, Catch::Contains("\"hang_verdict\":{\"attempt\":1,\"verdict\":\"attempt 1: hang: rank 1 has not "
                                       "called all_reduce #2 of group 0 (default_pg)"));
  CHECK_THAT(response, Catch::Contains("\"source\":\"flight_recorder\",\"blamed_ranks\":[1]}"));
  TempDir check_dir;
  const size_t at = response.find("\r\n\r\n");
  REQUIRE(at != std::string::npos);
  std::ofstream(check_dir.file("body.json")) << response.substr(at + 4);
  CHECK(ops::checkWithPython(check_dir.file("body.json"),
                             "import json,sys; d=json.load(open(sys.argv[1]))['hang_verdict']; "
                             "assert d['blamed_ranks'] == [1] and d['attempt'] == 1, d")
            .exit_code == 0);
  ddprun.signal(SIGTERM);
  REQUIRE(ddprun.wait(20s));
}
