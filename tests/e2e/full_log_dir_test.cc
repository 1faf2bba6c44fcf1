// A --log_dir that fills up (ENOSPC) must neither lose the worker's last words silently nor
// change its exit code (issue 21, #10). The test makes its own full filesystem: a 256 KiB
// tmpfs mounted in a private mount namespace (unshare -m) around the ddprun run, gone
// with it.
#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

constexpr const char* kUnshare = "/usr/bin/unshare";

// Whether this machine lets us mount a tmpfs in a private mount namespace (root, and a
// container that allows it).
bool canMountTmpfs(const std::string& dir) {
  auto r = run({kUnshare, "-m", "--propagation", "private", "mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", dir},
               {}, 10s);
  return r.finished && r.exit_code == 0;
}

}  // namespace

TEST_CASE("a full log directory is reported once per file and keeps the worker's exit code", "[e2e][logs]") {
  TempDir logs;
  if (!fileExists(kUnshare) || !canMountTmpfs(logs.path())) {
    WARN("SKIPPED: cannot mount a tmpfs in a private mount namespace here (needs root and unshare -m)");
    return;
  }
  // `set -e`: like a Python worker whose print raises, this worker dies (exit 1) if a write
  // of its own fails. Through ddprun it must never see one.
  const std::string worker =
      "set -e; yes 'a line of output that fills the small log directory' | head -c 600000; "
      "echo 'worker stderr: the real reason, disk quota of the dataset exceeded' >&2; exit 7";
  const std::string command = "mount -t tmpfs -o size=256k tmpfs " + logs.path() + " && exec " + ddprunPath() +
                              " --nproc_per_node=1 --rdzv_id=fulljob --redirects=3 --log_dir " + logs.path() +
                              " --no_python sh -c \"$0\"";
  auto r = run({kUnshare, "-m", "--propagation", "private", "/bin/sh", "-c", command, worker}, {}, 60s);
  REQUIRE(r.finished);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("exit      : exit code 7"));
  CHECK_THAT(r.err, !Catch::Contains("exit code 1\n"));
  // One warning per file, naming it and the error.
  CHECK_THAT(r.err, Catch::Contains(logs.path() + "/fulljob_"));
  CHECK(countOf(r.err, "/attempt_0/0/stdout.log: No space left on device") == 1);
  CHECK(countOf(r.err, "/attempt_0/0/stderr.log: No space left on device") == 1);
  // The worker's last stderr line, lost to the full disk, is in the failure report.
  const auto report = r.err.find("Root cause");
  REQUIRE(report != std::string::npos);
  CHECK_THAT(r.err.substr(report),
             Catch::Contains("worker stderr: the real reason, disk quota of the dataset exceeded"));
}
