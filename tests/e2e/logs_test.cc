#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;
namespace fs = std::filesystem;

namespace {

// The single <run_id>_<unique> directory ddprun made under `log_dir`.
std::string runDirIn(const std::string& log_dir, const std::string& run_id) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(log_dir)) {
    if (entry.path().filename().string().rfind(run_id + "_", 0) == 0) found.push_back(entry.path().string());
  }
  return found.size() == 1 ? found[0] : "";
}

std::vector<std::string> linesOf(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

TEST_CASE("redirects=3 writes each worker's streams to its own files", "[e2e][logs]") {
  TempDir logs;
  auto r = run({ddprunPath(), "--nproc_per_node=2", "--rdzv_id=job1", "--log_dir", logs.path(), "--redirects=3",
                "--no_python", testWorkerPath(), "lines", "5"});
  REQUIRE(r.finished);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, !Catch::Contains("line 0"));
  std::string run_dir = runDirIn(logs.path(), "job1");
  REQUIRE_FALSE(run_dir.empty());
  for (int rank = 0; rank < 2; ++rank) {
    std::string dir = run_dir + "/attempt_0/" + std::to_string(rank);
    std::string out = readFile(dir + "/stdout.log");
    std::string err = readFile(dir + "/stderr.log");
    CHECK(countOf(out, "rank " + std::to_string(rank) + " line ") == 5);
    CHECK(countOf(err, "rank " + std::to_string(rank) + " err ") == 5);
    CHECK(countOf(out, "rank " + std::to_string(1 - rank)) == 0);
  }
}

TEST_CASE("tee prefixes console lines with the global rank and never splits a line", "[e2e][logs]") {
  TempDir logs;
  auto r = run({ddprunPath(), "--nproc_per_node=3", "--rdzv_id=job2", "--log_dir", logs.path(), "--tee=3",
                "--no_python", testWorkerPath(), "lines", "300"});
  REQUIRE(r.finished);
  REQUIRE(r.exit_code == 0);
  const std::regex out_line(R"(\[rank([0-2])\]:rank \1 line (\d+) ([a-z])\3{199} end)");
  int matched = 0;
  for (const auto& line : linesOf(r.out)) {
    INFO(line);
    CHECK(std::regex_match(line, out_line));
    ++matched;
  }
  CHECK(matched == 900);
  CHECK(countOf(r.err, "[rank2]:rank 2 err ") == 300);
  // The files get the raw output, without prefixes.
  std::string out0 = readFile(runDirIn(logs.path(), "job2") + "/attempt_0/0/stdout.log");
  CHECK(countOf(out0, "rank 0 line ") == 300);
  CHECK(countOf(out0, "[rank") == 0);
}

// Issue 39, defect 14: each CRLF line also printed an empty "[rank0]:" line.
TEST_CASE("tee prints a CRLF line once and keeps a bare carriage return inside its line", "[e2e][logs]") {
  TempDir tmp;  // --tee without --log_dir keeps the logs under TMPDIR, as torchrun does
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--tee=3", "--no_python", "/usr/bin/printf",
                "a\\r\\nb\\r\\n10%%\\r20%%\\n"},
               {{"TMPDIR", tmp.path()}});
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("[rank0]:a\r\n[rank0]:b\r\n[rank0]:10%\r20%\n"));
  CHECK(countOf(r.out, "[rank0]:") == 3);
}

TEST_CASE("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE is honoured", "[e2e][logs]") {
  TempDir tmp;  // --tee without --log_dir keeps the logs under TMPDIR, as torchrun does
  auto r = run(
      {ddprunPath(), "--nproc_per_node=2", "--role=trainer", "--tee=1", "--no_python", testWorkerPath(), "lines", "2"},
      {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "<${role_name}|${local_rank}|$rank> "}, {"TMPDIR", tmp.path()}});
  REQUIRE(r.finished);
  REQUIRE(r.exit_code == 0);
  CHECK(countOf(r.out, "<trainer|1|1> rank 1 line") == 2);
  // stderr is not teed: it reaches the console as the worker wrote it.
  CHECK(countOf(r.err, "\nrank 1 err 0") + (r.err.rfind("rank 1 err 0", 0) == 0) >= 1);
  CHECK(countOf(r.err, "|1|1> rank 1 err") == 0);
}

TEST_CASE("local_ranks_filter shows only the chosen ranks on the console", "[e2e][logs]") {
  auto r = run(
      {ddprunPath(), "--nproc_per_node=3", "--local_ranks_filter=1", "--no_python", testWorkerPath(), "lines", "4"});
  REQUIRE(r.finished);
  REQUIRE(r.exit_code == 0);
  CHECK(countOf(r.out, "[rank1]:rank 1 line") == 4);
  CHECK(countOf(r.out, "rank 0 line") == 0);
  CHECK(countOf(r.out, "rank 2 line") == 0);
  CHECK(countOf(r.err, "[rank1]:rank 1 err") == 4);
}

TEST_CASE("a per-rank redirect map applies to the named ranks only", "[e2e][logs]") {
  TempDir logs;
  auto r = run({ddprunPath(), "--nproc_per_node=2", "--rdzv_id=job3", "--log_dir", logs.path(), "-r", "0:1",
                "--no_python", testWorkerPath(), "lines", "3"});
  REQUIRE(r.finished);
  REQUIRE(r.exit_code == 0);
  CHECK(countOf(r.out, "rank 0 line") == 0);
  CHECK(countOf(r.out, "rank 1 line") == 3);
  CHECK(countOf(r.err, "rank 0 err") == 3);
  std::string run_dir = runDirIn(logs.path(), "job3");
  CHECK(countOf(readFile(run_dir + "/attempt_0/0/stdout.log"), "rank 0 line") == 3);
}

TEST_CASE("error files and attempts live under --log_dir", "[e2e][logs]") {
  TempDir logs;
  auto r = run({ddprunPath(), "--nproc_per_node=1", "--rdzv_id=job4", "--max_restarts=1", "--log_dir", logs.path(),
                "--no_python", testWorkerPath(), "throw", "broken"});
  REQUIRE(r.finished);
  CHECK(r.exit_code == 1);
  std::string run_dir = runDirIn(logs.path(), "job4");
  REQUIRE_FALSE(run_dir.empty());
  CHECK_THAT(readFile(run_dir + "/attempt_0/0/error.json"), Catch::Contains("broken"));
  CHECK_THAT(readFile(run_dir + "/attempt_1/0/error.json"), Catch::Contains("broken"));
  CHECK_THAT(r.err, Catch::Contains(run_dir + "/attempt_1/0/error.json"));
}

TEST_CASE("a run directory that stays keeps no RPC secret or Python hook once the run ends", "[e2e][logs]") {
  TempDir dir;
  // Each worker shows that its secret and ddprun's hook were there while it ran. The workers
  // share ddprun's stdout: each line is one write, or the two ranks' lines can meet (print()
  // under PYTHONUNBUFFERED writes the newline apart).
  const std::string script = dir.file("secret.py");
  std::ofstream(script) << "import os\n"
                           "path = os.environ['DDPRUN_RPC_SECRET_FILE']\n"
                           "run_dir = os.path.dirname(os.path.dirname(os.path.dirname(path)))\n"
                           "hook = os.path.isfile(os.path.join(run_dir, 'python_hook', 'sitecustomize.py'))\n"
                           "os.write(1, f\"rank {os.environ['RANK']} secret={os.path.getsize(path) > 0} hook={hook} "
                           "file={path}\\n\".encode())\n";
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--log_dir", dir.file("logs"), script},
               {{"PYTHON", "/usr/bin/python3"}}, 60s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("rank 0 secret=True hook=True file="));
  CHECK_THAT(r.out, Catch::Contains("rank 1 secret=True hook=True file="));
  const auto at = r.out.find(" file=") + 6;
  const std::string secret = r.out.substr(at, r.out.find('\n', at) - at);
  const fs::path run_dir = fs::path(secret).parent_path().parent_path().parent_path();
  CHECK(run_dir.parent_path() == fs::path(dir.file("logs")));
  REQUIRE(fs::is_directory(run_dir));
  CHECK_FALSE(fs::exists(run_dir / "python_hook"));
  std::vector<std::string> secrets;
  for (const auto& entry : fs::recursive_directory_iterator(run_dir)) {
    if (entry.path().filename() == "rpc_secret") secrets.push_back(entry.path().string());
  }
  CHECK(secrets.empty());
}

TEST_CASE("without --log_dir the temporary run directory is removed at the end", "[e2e][logs]") {
  auto r = run({ddprunPath(), "--nproc_per_node=1", "--no_python", testWorkerPath(), "env"});
  REQUIRE(r.finished);
  REQUIRE(r.exit_code == 0);
  auto pos = r.out.find("TORCHELASTIC_ERROR_FILE=");
  REQUIRE(pos != std::string::npos);
  std::string error_file = r.out.substr(pos + 24, r.out.find('\n', pos) - pos - 24);
  std::string run_dir = fs::path(error_file).parent_path().parent_path().parent_path().string();
  CHECK_THAT(run_dir, Catch::Contains("ddprun-none_"));
  CHECK_FALSE(fs::exists(run_dir));
}
