// torchrun 2.x's newer flags as a user sees them through the real binary:
// --signals_to_handle, --virtual_local_rank, TORCHELASTIC_HEALTH_CHECK_PORT and the refused
// store_type=file.
#include <csignal>

#include <catch2/catch.hpp>

#include "tests/e2e/ops_support.h"
#include "tests/support/test_process.h"

using namespace ddprun::testing;

TEST_CASE("a signal named in --signals-to-handle stops the job and others are still forwarded", "[e2e][signals]") {
  TempDir dir;
  TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=2", "--term_timeout=2",
                      "--signals-to-handle=SIGUSR1", "--no_python", testWorkerPath(), "wait", dir.path()});
  REQUIRE(ddprun.waitForOutput("ready rank=", 20s, 2));
  // SIGUSR2 is not in the list: forwarded, and the job goes on.
  ddprun.signal(SIGUSR2);
  CHECK(eventually([&] { return fileExists(dir.file("usr2.0")) && fileExists(dir.file("usr2.1")); }, 10s));
  CHECK_FALSE(ddprun.wait(300ms));
  // SIGUSR1 is: it reaches the workers as their stop signal (the test worker lives on after
  // it, so --term_timeout later SIGKILL ends them) and ddprun exits 128+SIGUSR1.
  ddprun.signal(SIGUSR1);
  REQUIRE(ddprun.wait(20s));
  CHECK(ddprun.exitCode() == 128 + SIGUSR1);
  CHECK(fileExists(dir.file("usr1.0")));
  CHECK(fileExists(dir.file("usr1.1")));
  CHECK_THAT(ddprun.err(), Catch::Contains("received SIGUSR1; stopping the workers"));
}

TEST_CASE("TORCHELASTIC_SIGNALS_TO_HANDLE sets the stop signals when the flag is absent", "[e2e][signals]") {
  TempDir dir;
  TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=1", "--term_timeout=10", "--no_python",
                      testWorkerPath(), "wait", dir.path()},
                     {{"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGUSR2"}});
  REQUIRE(ddprun.waitForOutput("ready rank=", 20s));
  ddprun.signal(SIGUSR2);
  REQUIRE(ddprun.wait(20s));
  CHECK(ddprun.exitCode() == 128 + SIGUSR2);
  CHECK(fileExists(dir.file("usr2.0")));
}

TEST_CASE("a signal left out of --signals_to_handle gets its default action", "[e2e][signals]") {
  TempDir dir;
  TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=1", "--signals_to_handle=SIGTERM", "--no_python",
                      testWorkerPath(), "wait", dir.path()});
  REQUIRE(ddprun.waitForOutput("ready rank=", 20s));
  ddprun.signal(SIGHUP);
  REQUIRE(ddprun.wait(20s));
  CHECK(ddprun.termSignal() == SIGHUP);
  // ddprun did not forward it; the orphan guard SIGKILLs the worker instead.
  CHECK_FALSE(fileExists(dir.file("hup.0")));
}

TEST_CASE("virtual_local_rank gives each worker LOCAL_RANK=0 and its own device", "[e2e][env]") {
  const std::vector<std::string> print = {
      "--no_python", "sh", "-c",
      "echo \"V RANK=$RANK LOCAL_RANK=$LOCAL_RANK CVD=$CUDA_VISIBLE_DEVICES LWS=$LOCAL_WORLD_SIZE GR=$GROUP_RANK\""};
  auto runWith = [&](const std::string& nproc, const std::string& visible) {
    std::vector<std::string> argv{ddprunPath(), "--standalone", "--nproc_per_node=" + nproc, "--virtual-local-rank"};
    argv.insert(argv.end(), print.begin(), print.end());
    return run(argv, {{"CUDA_VISIBLE_DEVICES", visible}}, 60s);
  };
  auto unset = runWith("3", "");  // an empty value unsets it: devices are the local ranks
  REQUIRE(unset.finished);
  INFO(unset.out << unset.err);
  CHECK(unset.exit_code == 0);
  CHECK(countOf(unset.out, "V RANK=0 LOCAL_RANK=0 CVD=0 LWS=3 GR=0\n") == 1);
  CHECK(countOf(unset.out, "V RANK=1 LOCAL_RANK=0 CVD=1 LWS=3 GR=0\n") == 1);
  CHECK(countOf(unset.out, "V RANK=2 LOCAL_RANK=0 CVD=2 LWS=3 GR=0\n") == 1);

  auto listed = runWith("2", "5,7");
  REQUIRE(listed.finished);
  INFO(listed.out << listed.err);
  CHECK(listed.exit_code == 0);
  CHECK(countOf(listed.out, "V RANK=0 LOCAL_RANK=0 CVD=5 LWS=2 GR=0\n") == 1);
  CHECK(countOf(listed.out, "V RANK=1 LOCAL_RANK=0 CVD=7 LWS=2 GR=0\n") == 1);

  auto short_list = runWith("2", "5");
  REQUIRE(short_list.finished);
  CHECK(short_list.exit_code == 2);
  CHECK_THAT(short_list.err, Catch::StartsWith("ddprun: error: --virtual_local_rank"));
  CHECK(countOf(short_list.out, "V RANK=") == 0);
}

TEST_CASE("TORCHELASTIC_HEALTH_CHECK_PORT turns the health check on", "[e2e][ops]") {
  TempDir dir;
  TestProcess ddprun(
      {ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_python", testWorkerPath(), "wait", dir.path()},
      {{"TORCHELASTIC_HEALTH_CHECK_PORT", "0"}});
  const int port = ops::healthPort(ddprun);
  REQUIRE(port > 0);
  REQUIRE(ddprun.waitForOutput("ready rank=", 20s));
  std::string response;
  CHECK(eventually(
      [&] {
        response = ops::httpGet(port);
        return response.find("\"state\":\"running\"") != std::string::npos;
      },
      10s));
  CHECK(response.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  ddprun.signal(SIGTERM);
  REQUIRE(ddprun.wait(20s));
  CHECK(ddprun.exitCode() == 128 + SIGTERM);
}

TEST_CASE("rdzv_conf store_type=file is refused in one line with exit 2", "[e2e][bad_input]") {
  TempDir dir;
  auto r = run({ddprunPath(), "--standalone", "--rdzv_conf", "store_type=file", "--no_python", "sh", "-c",
                "touch " + dir.file("started")});
  REQUIRE(r.finished);
  CHECK(r.exit_code == 2);
  CHECK(r.err ==
        "ddprun: error: --rdzv_conf store_type=file: ddprun's rendezvous uses a TCP store only; "
        "store_type=file is not supported\n");
  CHECK_FALSE(fileExists(dir.file("started")));
}
