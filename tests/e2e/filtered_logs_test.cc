// --duplicate_stdout_filters / --duplicate_stderr_filters through the real ddprun: the
// attempt's filtered_std{out,err}.log hold exactly the matching lines of the teed ranks,
// with their console prefixes, while the ordinary logs stay complete.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <sstream>

#include "tests/support/test_process.h"

using namespace ddprun::testing;
namespace fs = std::filesystem;

namespace {

std::string runDirIn(const std::string& log_dir) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(log_dir)) found.push_back(entry.path().string());
  return found.size() == 1 ? found[0] : "";
}

std::vector<std::string> sortedLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::sort(lines.begin(), lines.end());
  return lines;
}

// Three lines on stdout and two on stderr per worker.
const std::vector<std::string> kFruitWorker = {
    "--no_python", "/bin/sh", "-c",
    "echo \"apple $LOCAL_RANK\"; echo \"banana $LOCAL_RANK\"; echo \"kiwi,lime $LOCAL_RANK\"; "
    "echo \"apple err $LOCAL_RANK\" >&2; echo \"plain err $LOCAL_RANK\" >&2"};

RunResult runFruit(const TempDir& logs, std::vector<std::string> flags) {
  std::vector<std::string> argv = {ddprunPath(), "--nproc_per_node=2", "--log_dir", logs.path()};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), kFruitWorker.begin(), kFruitWorker.end());
  return run(argv, {}, 30s);
}

using Lines = std::vector<std::string>;

}  // namespace

TEST_CASE("duplicate filters copy the matching teed lines of every rank to one file", "[e2e][filters]") {
  TempDir logs;
  auto r =
      runFruit(logs, {"--tee=3", "--duplicate-stdout-filters=apple,kiwi,,lime", "--duplicate_stderr_filters", "plain"});
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const std::string attempt = runDirIn(logs.path()) + "/attempt_0";
  CHECK(sortedLines(readFile(attempt + "/filtered_stdout.log")) ==
        Lines{"[rank0]:apple 0", "[rank0]:kiwi,lime 0", "[rank1]:apple 1", "[rank1]:kiwi,lime 1"});
  CHECK(sortedLines(readFile(attempt + "/filtered_stderr.log")) == Lines{"[rank0]:plain err 0", "[rank1]:plain err 1"});
  // The ordinary logs and the console keep everything.
  for (int rank = 0; rank < 2; ++rank) {
    const std::string n = std::to_string(rank);
    CHECK(readFile(attempt + "/" + n + "/stdout.log") == "apple " + n + "\nbanana " + n + "\nkiwi,lime " + n + "\n");
    CHECK(readFile(attempt + "/" + n + "/stderr.log") == "apple err " + n + "\nplain err " + n + "\n");
    CHECK(countOf(r.out, "[rank" + n + "]:banana " + n) == 1);
  }
}

TEST_CASE("duplicate filters follow --tee and --local_ranks_filter", "[e2e][filters]") {
  TempDir logs;
  auto r = runFruit(logs, {"--tee=0:1,1:3", "--local_ranks_filter=0", "--duplicate_stdout_filters=a",
                           "--duplicate_stderr_filters=err"});
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const std::string attempt = runDirIn(logs.path()) + "/attempt_0";
  // Rank 1 is teed but not shown on the console, so (as in torchrun) not filtered either;
  // rank 0's stderr is not teed.
  CHECK(sortedLines(readFile(attempt + "/filtered_stdout.log")) == Lines{"[rank0]:apple 0", "[rank0]:banana 0"});
  CHECK(readFile(attempt + "/filtered_stderr.log").empty());
}

TEST_CASE("duplicate filters without --tee warn that the file stays empty", "[e2e][filters]") {
  TempDir logs;
  auto r = runFruit(logs, {"--redirects=3", "--duplicate_stdout_filters=apple"});
  REQUIRE(r.finished);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.err, Catch::Contains("--duplicate_stdout_filters applies to teed stdout only"));
  const std::string attempt = runDirIn(logs.path()) + "/attempt_0";
  CHECK(fileExists(attempt + "/filtered_stdout.log"));
  CHECK(readFile(attempt + "/filtered_stdout.log").empty());
  CHECK_FALSE(fileExists(attempt + "/filtered_stderr.log"));
}

TEST_CASE("an empty duplicate filter is a usage error", "[e2e][filters]") {
  TempDir logs;
  for (const char* flag : {"--duplicate_stdout_filters=apple,", "--duplicate-stderr-filters=,apple"}) {
    auto r = runFruit(logs, {"--tee=3", flag});
    REQUIRE(r.finished);
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("empty filter (it would match every line); write ,, for a literal comma"));
    CHECK_THAT(r.out, !Catch::Contains("apple"));
  }
}
