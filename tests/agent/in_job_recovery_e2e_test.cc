// --recovery=in-job through the real ddprun with real processes: in_job_fake_worker (the
// runtime's part of the protocol played through the store client alone) fails on one rank;
// the test reads which processes started (their record file), ddprun's exit code, its log
// lines and its events file. Each run is bounded (60 s) and leaves no process behind
// (TestProcess kills the process group).
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

std::string fakeWorker() { return binDir() + "/in_job_fake_worker"; }

std::string readAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The record's start lines of `rank` ("start rank=R pid=P generation=G restart=C ...").
std::vector<std::string> startsOf(const std::string& record, int rank) {
  std::vector<std::string> found;
  std::istringstream in(record);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("start rank=" + std::to_string(rank) + " ", 0) == 0) found.push_back(line);
  }
  return found;
}

RunResult runJob(const TempDir& dir, const std::vector<std::string>& flags, const std::vector<std::string>& args) {
  std::vector<std::string> argv{ddprunPath(), "--standalone", "--nproc_per_node=3", "--term_timeout=5"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back("--no_python");
  argv.push_back(fakeWorker());
  argv.push_back(dir.file("record"));
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, {{"DDPRUN_EVENTS_FILE", dir.file("events.jsonl")}}, 60s);
}

}  // namespace

TEST_CASE("in-job e2e: the failed rank alone starts again and the others keep their processes", "[e2e]") {
  TempDir dir;
  const auto r = runJob(dir, {"--max_restarts=1", "--recovery=in-job"}, {"1", "1"});
  REQUIRE(r.finished);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  const std::string record = readAll(dir.file("record"));
  INFO(record);
  CHECK(startsOf(record, 0).size() == 1);  // one process each, never stopped nor started again
  CHECK(startsOf(record, 2).size() == 1);
  const auto rank1 = startsOf(record, 1);
  REQUIRE(rank1.size() == 2);
  CHECK_THAT(rank1[0], Catch::Contains("generation=0 restart=0 recovery=in-job"));
  CHECK_THAT(rank1[1], Catch::Contains("generation=1 restart=0 recovery=in-job"));
  CHECK(countOf(r.err, "replaced alone") == 1);
  CHECK(countOf(r.err, "restarting the worker group") == 0);
  const std::string events = readAll(dir.file("events.jsonl"));
  CHECK(countOf(events, "\"event\":\"worker_replaced\"") == 1);
  CHECK(countOf(events, "\"event\":\"restart\"") == 0);
}

TEST_CASE("in-job e2e: a replacement that fails again is replaced again while restarts are left", "[e2e]") {
  TempDir dir;
  const auto r = runJob(dir, {"--max_restarts=2", "--recovery=in-job"}, {"1", "2"});
  REQUIRE(r.finished);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  const std::string record = readAll(dir.file("record"));
  INFO(record);
  CHECK(startsOf(record, 0).size() == 1);
  CHECK(startsOf(record, 2).size() == 1);
  const auto rank1 = startsOf(record, 1);
  REQUIRE(rank1.size() == 3);
  CHECK_THAT(rank1[2], Catch::Contains("generation=2 restart=0"));
  CHECK(countOf(readAll(dir.file("events.jsonl")), "\"event\":\"worker_replaced\"") == 2);
}

TEST_CASE("in-job e2e: a rank that cannot re-form makes it a whole-group restart, said in one line", "[e2e]") {
  TempDir dir;
  const auto r = runJob(dir, {"--max_restarts=1", "--recovery=in-job"}, {"1", "1", "2"});
  REQUIRE(r.finished);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  const std::string record = readAll(dir.file("record"));
  INFO(record);
  for (int rank = 0; rank < 3; ++rank) {
    const auto starts = startsOf(record, rank);
    REQUIRE(starts.size() == 2);  // round 1, then the whole group again
    CHECK_THAT(starts[1], Catch::Contains("generation=0 restart=1"));
  }
  CHECK(countOf(r.err, "not in job: rank 2 never said it can re-form in process") == 1);
  CHECK(countOf(readAll(dir.file("events.jsonl")), "\"event\":\"worker_replaced\"") == 0);
}

TEST_CASE("in-job e2e: with the restarts spent the job fails as with --recovery=restart", "[e2e]") {
  TempDir dir;
  const auto r = runJob(dir, {"--max_restarts=0", "--recovery=in-job"}, {"1", "1"});
  REQUIRE(r.finished);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK(countOf(r.err, "not in job: no restarts left (0 of --max_restarts 0 used)") == 1);
  CHECK(startsOf(readAll(dir.file("record")), 1).size() == 1);
}

TEST_CASE("in-job e2e: on two nodes the failed rank alone starts again, the other agent does nothing", "[e2e]") {
  TempDir dir;
  const std::map<std::string, std::string> env{{"DDPRUN_EVENTS_FILE", dir.file("events.jsonl")}};
  const auto agent = [&](int port, bool host) {
    return std::vector<std::string>{
        ddprunPath(),
        "--nnodes=2",
        "--nproc_per_node=2",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
        "--rdzv_id=in-job-two-nodes",
        std::string("--rdzv_conf=keep_alive_interval=0.5,keep_alive_max_attempt=3,is_host=") +
            (host ? "true" : "false"),
        "--max_restarts=1",
        "--recovery=in-job",
        "--term_timeout=5",
        "--no_python",
        fakeWorker(),
        dir.file("record"),
        "1",
        "1"};
  };
  TestProcess first(agent(0, true), env);  // the store's host takes a port from the kernel
  const int port = announcedPort(first);
  TestProcess second(agent(port, false), env);
  REQUIRE(first.wait(60s));
  REQUIRE(second.wait(60s));
  INFO(first.err() + second.err());
  CHECK(first.exitCode() == 0);
  CHECK(second.exitCode() == 0);
  const std::string record = readAll(dir.file("record"));
  INFO(record);
  for (int rank : {0, 2, 3}) CHECK(startsOf(record, rank).size() == 1);
  const auto rank1 = startsOf(record, 1);
  REQUIRE(rank1.size() == 2);
  CHECK_THAT(rank1[1], Catch::Contains("generation=1 restart=0"));
  // One agent replaced it; the other node's agent stopped nothing and restarted nothing.
  CHECK(countOf(first.err(), "replaced alone") + countOf(second.err(), "replaced alone") == 1);
  CHECK(countOf(first.err() + second.err(), "restarting the worker group") == 0);
  CHECK(countOf(readAll(dir.file("events.jsonl")), "\"event\":\"worker_replaced\"") == 1);
}

TEST_CASE("in-job e2e: a bad --recovery value is a one-line usage error", "[e2e]") {
  auto r = run({ddprunPath(), "--standalone", "--recovery=sometimes", "--no_python", "true"}, {}, 30s);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("invalid --recovery value 'sometimes': expected restart or in-job"));
  auto pet = run({ddprunPath(), "--standalone", "--no_python", "true"}, {{"PET_RECOVERY", "never"}}, 30s);
  REQUIRE(pet.finished);
  CHECK(pet.exit_code == 2);
  CHECK_THAT(pet.err, Catch::Contains("invalid --recovery value 'never'"));
}
