// Files a worker controls, through the real ddprun (issue 44): a FIFO a failing worker leaves
// at its error file or among its Python hook's files must not block the agent (it used to wait
// in open() for ever, deaf to SIGTERM), and a --log_dir or TMPDIR in which another user could
// swap the run directory is refused in one line.
#include <sys/stat.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

TEST_CASE("a shell worker that leaves a FIFO at its error file fails the job with its own exit code",
          "[e2e][worker_files]") {
  TempDir dir;
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_python", "sh", "-c",
                "mkfifo \"$TORCHELASTIC_ERROR_FILE\" && exit 3"},
               {}, 60s);
  REQUIRE(r.finished);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("exit      : exit code 3"));
  CHECK_THAT(r.err, Catch::Contains("/error.json: a FIFO, not a regular file; not read)"));
}

TEST_CASE("after a worker left a FIFO at its error file, ddprun restarts the group and answers SIGTERM",
          "[e2e][worker_files]") {
  TempDir dir;
  // Attempt 0 leaves the FIFO and fails; attempt 1 says so and runs until stopped.
  const std::string marker = dir.file("failed_once");
  const std::string worker = "if [ -e " + marker + " ]; then echo attempt-1-running; exec sleep 60; fi; touch " +
                             marker + "; mkfifo \"$TORCHELASTIC_ERROR_FILE\"; exit 3";
  TestProcess ddprun(
      {ddprunPath(), "--standalone", "--nproc_per_node=1", "--max_restarts=1", "--no_python", "sh", "-c", worker});
  REQUIRE(ddprun.waitForOutput("attempt-1-running", 60s));
  ddprun.signal(SIGTERM);
  REQUIRE(ddprun.wait(20s));
  INFO(ddprun.err());
  CHECK(ddprun.exitCode() == 128 + SIGTERM);
}

TEST_CASE("a Python worker's FIFO among its hook's files does not hide its traceback", "[e2e][worker_files]") {
  TempDir dir;
  // At exit, after the hook saved the traceback, the newest py_exception.* is a FIFO.
  const std::string script = dir.file("fails.py");
  std::ofstream(script) << "import atexit, os, time\n"
                           "folder = os.environ['DDPRUN_PYTHON_STACKS_DIR']\n"
                           "def fifo():\n"
                           "    time.sleep(0.05)  # a newer time than the traceback's, at the kernel's granularity\n"
                           "    os.mkfifo(os.path.join(folder, 'py_exception.999999999'))\n"
                           "atexit.register(fifo)\n"
                           "raise RuntimeError('the worker failed by itself')\n";
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", script}, {{"PYTHON", "/usr/bin/python3"}}, 60s);
  REQUIRE(r.finished);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("exit      : exit code 1"));
  CHECK(countOf(r.err, "RuntimeError: the worker failed by itself") >= 1);
}

TEST_CASE("a --log_dir or TMPDIR that others may write without the sticky bit is refused in one line",
          "[e2e][worker_files]") {
  TempDir dir;
  const std::string shared = dir.file("shared");
  std::filesystem::create_directory(shared);
  REQUIRE(::chmod(shared.c_str(), 0777) == 0);
  const std::string reason =
      ": unsafe for a run directory: writable by others without the sticky bit (mode 0777), so another user could "
      "replace the run directory ddprun makes in it; use a directory of your own, or chmod +t it\n";
  auto log_dir =
      run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--log_dir", shared, "--no_python", "true"}, {}, 60s);
  REQUIRE(log_dir.finished);
  CHECK(log_dir.exit_code == 2);
  CHECK(log_dir.err == "ddprun: error: --log_dir " + shared + reason);
  auto tmpdir =
      run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_python", "true"}, {{"TMPDIR", shared}}, 60s);
  REQUIRE(tmpdir.finished);
  CHECK(tmpdir.exit_code == 2);
  CHECK_THAT(tmpdir.err, Catch::EndsWith("ddprun: error: TMPDIR " + shared + reason));
  CHECK(std::filesystem::is_empty(shared));
  // With the sticky bit, as /tmp has it, the same directory serves.
  REQUIRE(::chmod(shared.c_str(), 01777) == 0);
  auto sticky =
      run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_python", "true"}, {{"TMPDIR", shared}}, 60s);
  REQUIRE(sticky.finished);
  INFO(sticky.err);
  CHECK(sticky.exit_code == 0);
}
