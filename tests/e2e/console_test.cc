// A console nobody reads (a stalled `| less`, a log shipper, Ctrl-S) must not stop ddprun
// from handling signals or supervising its workers, nor cut its log files (issue 21, #8).
#include <algorithm>
#include <csignal>
#include <filesystem>
#include <string>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;
namespace fs = std::filesystem;

namespace {

// Far more than a pipe buffer (64 KiB) and the console queue (4 MiB): about 6 MB.
constexpr int kManyLines = 100000;

// A worker that writes its pid to DIR/pid, prints `lines` numbered lines, leaves
// DIR/printed and says "printed all" on stderr, then waits to be stopped.
std::vector<std::string> printingWorker(const std::string& dir, int lines) {
  return {"--no_python", "sh", "-c",
          "echo $$ > " + dir + "/pid; seq -f 'line %.0f of the worker, padded out to about sixty bytes' 1 " +
              std::to_string(lines) + "; touch " + dir + "/printed; echo printed all >&2; exec sleep 120"};
}

std::vector<std::string> ddprunWith(const std::string& tee, const std::string& log_dir,
                                    const std::vector<std::string>& worker) {
  std::vector<std::string> argv = {
      ddprunPath(), "--standalone", "--nproc_per_node=1", "--tee=" + tee, "--term_timeout=5", "--log_dir", log_dir};
  argv.insert(argv.end(), worker.begin(), worker.end());
  return argv;
}

std::string onlyStdoutLog(const std::string& log_dir) {
  for (const auto& entry : fs::recursive_directory_iterator(log_dir)) {
    if (entry.path().filename() == "stdout.log") return entry.path().string();
  }
  return "";
}

bool endsWith(const std::string& text, const std::string& tail) {
  return text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

TEST_CASE("a stalled console blocks neither output to the log files nor SIGTERM", "[e2e][console]") {
  TempDir dir, logs;
  // The test does not read ddprun's stdout or stderr (both pipes) until ddprun has exited:
  // TestProcess reads only inside wait() and waitForOutput().
  TestProcess ddprun(ddprunWith("3", logs.path(), printingWorker(dir.path(), kManyLines)));
  REQUIRE(eventually([&] { return !readFile(dir.file("pid")).empty(); }, 20s));
  const pid_t worker = static_cast<pid_t>(std::stol(readFile(dir.file("pid"))));
  // The agent keeps draining the worker into its log file although the console is full.
  CHECK(eventually([&] { return fileExists(dir.file("printed")); }, 30s));

  ddprun.signal(SIGTERM);
  bool stopped = eventually([&] { return !processAlive(ddprun.pid()); }, 15s);
  if (!stopped) {
    ddprun.signal(SIGTERM);
    stopped = eventually([&] { return !processAlive(ddprun.pid()); }, 15s);
  }
  CHECK(stopped);
  // Stopped by the agent, or by PR_SET_PDEATHSIG should the agent have died first.
  CHECK(eventually([&] { return !processAlive(worker); }, 5s));
  // Now read what ddprun wrote, which lets it end even if it was stuck.
  REQUIRE(ddprun.wait(20s));
  CHECK(ddprun.exitCode() == 128 + SIGTERM);

  const std::string log = readFile(onlyStdoutLog(logs.path()));
  CHECK(countOf(log, "\n") == kManyLines);
  CHECK(log.rfind("line 1 of the worker", 0) == 0);
  CHECK(endsWith(log, "line " + std::to_string(kManyLines) + " of the worker, padded out to about sixty bytes\n"));
}

TEST_CASE("with a console that is read, tee shows every line and SIGTERM stops the job", "[e2e][console]") {
  constexpr int kLines = 20000;
  TempDir dir, logs;
  TestProcess ddprun(ddprunWith("3", logs.path(), printingWorker(dir.path(), kLines)));
  REQUIRE(ddprun.waitForOutput("[rank0]:printed all", 60s));
  ddprun.signal(SIGTERM);
  REQUIRE(ddprun.wait(20s));
  CHECK(ddprun.exitCode() == 128 + SIGTERM);
  CHECK(countOf(ddprun.out(), "[rank0]:line ") == kLines);
  CHECK_THAT(ddprun.out(), Catch::Contains("[rank0]:line " + std::to_string(kLines) + " of the worker"));
  CHECK_THAT(ddprun.err(), !Catch::Contains("console stalled"));
  CHECK(countOf(readFile(onlyStdoutLog(logs.path())), "\n") == kLines);
}

TEST_CASE("a console that stalls and resumes gets a count of the lines dropped meanwhile", "[e2e][console]") {
  TempDir dir, logs;
  TestProcess ddprun(ddprunWith("1", logs.path(), printingWorker(dir.path(), kManyLines)));
  // Stalled while the worker prints more than the console queue holds...
  REQUIRE(eventually([&] { return fileExists(dir.file("printed")); }, 60s));
  // ...then read again: ddprun says how much the console missed.
  REQUIRE(ddprun.waitForOutput("console stalled: dropped ", 30s));
  ddprun.signal(SIGTERM);
  REQUIRE(ddprun.wait(20s));
  CHECK(ddprun.exitCode() == 128 + SIGTERM);
  CHECK(countOf(ddprun.err(), "console stalled: dropped ") == 1);
  CHECK(countOf(ddprun.out(), "[rank0]:line ") < kManyLines);
  CHECK(countOf(readFile(onlyStdoutLog(logs.path())), "\n") == kManyLines);
}
