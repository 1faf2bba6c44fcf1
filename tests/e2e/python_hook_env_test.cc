// What ddprun's Python hook and torch's flight recorder defaults look like from inside a
// Python worker (no torch needed): the variables, the user's own sitecustomize still run,
// what the user set kept, and the flags that turn each off.
#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

// Prints the variables and whether the user's sitecustomize ran (it sets USER_SITE_RAN). The
// workers share ddprun's stdout: the lines go in one write (under 4 KiB, so whole), or the two
// ranks' lines can meet (print() under PYTHONUNBUFFERED writes each newline apart).
std::string writeScript(const TempDir& dir) {
  const std::string path = dir.file("env.py");
  std::ofstream(path)
      << "import os, sys, sitecustomize\n"
         "lines = []\n"
         "for name in ['TORCH_NCCL_TRACE_BUFFER_SIZE', 'TORCH_FR_BUFFER_SIZE', "
         "'TORCH_NCCL_DUMP_ON_TIMEOUT', 'TORCH_NCCL_DEBUG_INFO_TEMP_FILE', 'TORCH_FR_DUMP_TEMP_FILE',"
         " 'DDPRUN_PYTHON_STACKS_DIR']:\n"
         "    lines.append(f\"rank {os.environ['RANK']} {name}={os.environ.get(name, '<unset>')}\\n\")\n"
         "lines.append(f\"rank {os.environ['RANK']} user_site={getattr(sitecustomize, 'USER_SITE_RAN', "
         "False)} hook_on_path={any(p.endswith('/python_hook') for p in sys.path)}\\n\")\n"
         "os.write(1, ''.join(lines).encode())\n";
  std::filesystem::create_directories(dir.file("usersite"));
  std::ofstream(dir.file("usersite/sitecustomize.py")) << "USER_SITE_RAN = True\n";
  return path;
}

}  // namespace

TEST_CASE("Python workers get torch's flight recorder variables and the hook, which runs the user's sitecustomize",
          "[e2e]") {
  TempDir dir;
  const std::string script = writeScript(dir);
  const std::string logs = dir.file("logs");
  auto r =
      run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--log_dir=" + logs, script},
          {{"PYTHON", "/usr/bin/python3"}, {"PYTHONPATH", dir.file("usersite")}, {"TORCH_FR_BUFFER_SIZE", "7"}}, 60s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  for (const std::string rank : {"0", "1"}) {
    // The user's TORCH_FR_BUFFER_SIZE is kept, and its older name left alone.
    CHECK_THAT(r.out, Catch::Contains("rank " + rank + " TORCH_FR_BUFFER_SIZE=7"));
    CHECK_THAT(r.out, Catch::Contains("rank " + rank + " TORCH_NCCL_TRACE_BUFFER_SIZE=<unset>"));
    CHECK_THAT(r.out, Catch::Contains("rank " + rank + " TORCH_NCCL_DUMP_ON_TIMEOUT=1"));
    CHECK_THAT(r.out, Catch::Contains("rank " + rank + " TORCH_NCCL_DEBUG_INFO_TEMP_FILE=" + logs));
    CHECK_THAT(r.out, Catch::Contains("/attempt_0/torch_trace_rank_\n"));
    CHECK_THAT(r.out, Catch::Contains("rank " + rank + " TORCH_FR_DUMP_TEMP_FILE=" + logs));
    CHECK_THAT(r.out, Catch::Contains("rank " + rank + " DDPRUN_PYTHON_STACKS_DIR=" + logs));
    CHECK_THAT(r.out, Catch::Contains("rank " + rank + " user_site=True hook_on_path=False"));
  }
}

TEST_CASE("the flags --no_torch_flight_recorder and --no_python_stacks turn them off", "[e2e]") {
  TempDir dir;
  const std::string script = writeScript(dir);
  auto r = run(
      {ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_torch_flight_recorder", "--no_python_stacks", script},
      {{"PYTHON", "/usr/bin/python3"}, {"PYTHONPATH", dir.file("usersite")}}, 60s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  for (const std::string name :
       {"TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE", "DDPRUN_PYTHON_STACKS_DIR"}) {
    CHECK_THAT(r.out, Catch::Contains("rank 0 " + name + "=<unset>"));
  }
  CHECK_THAT(r.out, Catch::Contains("rank 0 user_site=True hook_on_path=False"));
}
