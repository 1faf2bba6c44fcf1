#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

TEST_CASE("bad input: one line, exit 2, no worker started", "[e2e][bad_input]") {
  TempDir dir;
  std::string marker = dir.file("started");
  // Any worker that starts leaves this file behind.
  std::vector<std::string> worker = {"--no_python", "sh", "-c", "touch " + marker};
  const std::vector<std::vector<std::string>> bad = {
      {"--bogus-flag"},           {"--nnodes", "3:2"},  {"--nproc_per_node", "0"}, {"--nproc_per_node", "abc"},
      {"--rdzv_conf", "novalue"}, {"--redirects", "9"}, {"--tee", "0:1:2"},        {"--log_dir", "/proc/forbidden"},
  };
  for (auto args : bad) {
    args.insert(args.begin(), ddprunPath());
    args.insert(args.end(), worker.begin(), worker.end());
    INFO(Catch::Detail::stringify(args));
    auto r = run(args);
    REQUIRE(r.finished);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::StartsWith("ddprun: error: "));
    CHECK(countOf(r.err, "\n") == 1);
    CHECK_FALSE(fileExists(marker));
  }
  for (const auto& args :
       std::vector<std::vector<std::string>>{{ddprunPath(), "--no_python", dir.file("missing-program")},
                                             {ddprunPath(), "--no_python", dir.path()},
                                             {ddprunPath(), dir.file("missing.py")},
                                             {ddprunPath(), "--nproc_per_node=2"}}) {
    INFO(Catch::Detail::stringify(args));
    auto r = run(args);
    REQUIRE(r.finished);
    CHECK(r.exit_code == 2);
    CHECK(countOf(r.err, "\n") == 1);
  }
}

TEST_CASE("help prints the flags and exits 0", "[e2e][bad_input]") {
  auto r = run({ddprunPath(), "--help"});
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("--nproc_per_node"));
  CHECK_THAT(r.out, Catch::Contains("training_script"));
}

TEST_CASE("ddprun --version prints the version, the git revision and the store wire generations", "[e2e][bad_input]") {
  auto r = run({ddprunPath(), "--version"});
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(r.err.empty());
  CHECK_THAT(r.out,
             Catch::Matches("ddprun [0-9]+\\.[0-9]+\\.[0-9]+( \\(git [0-9a-f]{12}(\\+dirty)?\\))?\n"
                            "store wire: torch 2\\.x TCPStore \\(VALIDATE handshake\\), torch 1\\.13 TCPStore\n"));
  // Built from a git checkout, the revision is known.
  if (fileExists(std::string(DDPRUN_TEST_SOURCE_DIR) + "/.git")) CHECK_THAT(r.out, Catch::Contains("(git "));
}

TEST_CASE("a --version after the program belongs to the program", "[e2e][bad_input]") {
  auto r = run({ddprunPath(), "--standalone", "--no_python", "sh", "-c", "echo \"worker got $1\"", "sh", "--version"});
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("worker got --version"));
  CHECK_THAT(r.out, !Catch::Contains("store wire"));
}

TEST_CASE("an unreachable rendezvous store fails with exit 3 within join_timeout", "[e2e][bad_input]") {
  auto start = std::chrono::steady_clock::now();
  // Node 1 of a static job whose node 0 never comes up (port 1 is never served).
  auto r = run({ddprunPath(), "--nnodes=2", "--node_rank=1", "--master_addr=127.0.0.1", "--master_port=1",
                "--rdzv_conf=join_timeout=1", "--no_python", "true"},
               {}, 30s);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 3);
  CHECK_THAT(r.err, Catch::Contains("127.0.0.1:1"));
  CHECK(std::chrono::steady_clock::now() - start < 15s);
}

TEST_CASE("DDPRUN_NO_CGROUPS takes a boolean and anything else is one line naming it and exit 2", "[e2e][bad_input]") {
  TempDir dir;
  const std::string marker = dir.file("started");
  for (const char* value : {"maybe", "2", "off-ish"}) {
    INFO(value);
    auto r = run({ddprunPath(), "--standalone", "--no_python", "sh", "-c", "touch " + marker},
                 {{"DDPRUN_NO_CGROUPS", value}});
    REQUIRE(r.finished);
    CHECK(r.exit_code == 2);
    CHECK(r.err == std::string("ddprun: error: DDPRUN_NO_CGROUPS=") + value +
                       ": not a boolean (1/0, true/false, yes/no, on/off)\n");
    CHECK_FALSE(fileExists(marker));
  }
  // false and no keep cgroups on as 0 does; with the logs at debug the agent says which it uses.
  for (const char* value : {"0", "false", "no", ""}) {
    INFO(value);
    auto r = run({ddprunPath(), "--standalone", "--no_python", "true"},
                 {{"DDPRUN_NO_CGROUPS", value}, {"DDPRUN_LOG_LEVEL", "agent=debug"}});
    REQUIRE(r.finished);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.err, !Catch::Contains("(DDPRUN_NO_CGROUPS is set)"));
  }
  for (const char* value : {"1", "true", "yes"}) {
    INFO(value);
    auto r = run({ddprunPath(), "--standalone", "--no_python", "true"},
                 {{"DDPRUN_NO_CGROUPS", value}, {"DDPRUN_LOG_LEVEL", "agent=debug"}});
    REQUIRE(r.finished);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.err, Catch::Contains("contained by process groups only (DDPRUN_NO_CGROUPS is set)"));
  }
}

// Many jobs on one machine: when the port a job asks for is taken, the one error line names
// the port and the process holding it, so the user knows which job to look at.
TEST_CASE("a rendezvous or health port already taken names the port and the process that holds it",
          "[e2e][bad_input]") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(fd, 4) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  const std::string holder = "held by pid " + std::to_string(::getpid());
  const std::vector<std::vector<std::string>> taken = {
      {"--nnodes=1", "--master_addr=127.0.0.1", "--master_port=" + port, "--node_rank=0"},
      {"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + port, "--rdzv_conf=is_host=1"},
      {"--standalone", "--health_check_port=" + port, "--health_check_addr=127.0.0.1"},
  };
  for (auto args : taken) {
    args.insert(args.begin(), ddprunPath());
    args.insert(args.end(), {"--nproc_per_node=1", "--no_python", "true"});
    INFO(Catch::Detail::stringify(args));
    auto r = run(args);
    REQUIRE(r.finished);
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.err, Catch::Contains(port) && Catch::Contains("Address already in use") && Catch::Contains(holder));
    CHECK(countOf(r.err, "\n") == 1);
  }
  ::close(fd);
}
