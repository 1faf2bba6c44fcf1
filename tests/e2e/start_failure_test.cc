// A worker that cannot start (a script whose #! interpreter is missing, here) ends the job at
// once with one line that names the program and the reason, and nothing is signalled: no
// worker process group exists yet to be cleared (issue 39, #1: ddprun signalled PID 1). The
// test runs ddprun in a private PID namespace (unshare --pid) under a recording PID 1 that writes
// down every signal it gets, so that a real PID 1 is never at risk.
#include <sys/stat.h>

#include <fstream>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

constexpr const char* kUnshare = "/usr/bin/unshare";

// The recording PID 1: records each catchable signal to $1 (SIGKILL and SIGSTOP from inside its
// namespace never reach a PID 1), runs the rest of its arguments as its child, and exits with
// the child's status once it is reaped. The child's death ends the namespace and every
// process left in it.
constexpr const char* kRecordingInit = R"(rec=$1; shift
for s in TERM HUP INT QUIT USR1 USR2 ABRT CONT ALRM; do trap "echo SIG$s >> $rec" $s; done
"$@" &
child=$!
while :; do wait $child; rc=$?; kill -0 $child 2>/dev/null || break; done
wait $child; rc=$?
echo "exit $rc" >> $rec
exit $rc)";

bool canUnsharePid() {
  if (!fileExists(kUnshare)) return false;
  auto r = run({kUnshare, "--pid", "--fork", "--mount-proc", "--kill-child", "/bin/true"}, {}, 10s);
  return r.finished && r.exit_code == 0;
}

}  // namespace

TEST_CASE("a worker that cannot start is one line and exit 1 and PID 1 gets no signal", "[e2e][bad_input]") {
  if (!canUnsharePid()) {
    WARN("SKIPPED: cannot make a private PID namespace here (needs root and unshare --pid)");
    return;
  }
  TempDir dir;
  const std::string script = dir.file("train.sh");
  std::ofstream(script) << "#!/nonexistent/interpreter\necho started\n";
  ::chmod(script.c_str(), 0755);
  const std::string record = dir.file("pid1-record");
  // --term_timeout=120: a ddprun that waited on PID 1 (kill(1, 0) always succeeds) would
  // outlive the run's bound below rather than pass by luck.
  auto r = run(
      {kUnshare, "--pid", "--fork", "--mount-proc", "--kill-child", "/bin/bash", "-c", kRecordingInit, "recording-init",
       record, ddprunPath(), "--standalone", "--nproc_per_node=2", "--term_timeout=120", "--no_python", script},
      {}, 60s);
  INFO(r.out << r.err);
  INFO("PID 1 recorded: " << readFile(record));
  REQUIRE(r.finished);
  CHECK(r.exit_code == 1);
  CHECK(readFile(record) == "exit 1\n");
  CHECK_THAT(r.out, !Catch::Contains("started"));
  // One line, naming the program and why it cannot run.
  CHECK(countOf(r.err, "error") == 1);
  CHECK_THAT(r.err,
             Catch::Contains("cannot start workers: exec " + script +
                             " (its #! interpreter /nonexistent/interpreter is missing): No such file or directory"));
  CHECK_THAT(r.err, !Catch::Contains("SIGKILL") && !Catch::Contains("SIGTERM"));
}
