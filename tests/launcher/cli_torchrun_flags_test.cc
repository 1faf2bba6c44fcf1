// torchrun 2.x's newer flags and variables: --signals_to_handle, --shutdown_timeout,
// --virtual_local_rank, PYTHON_EXEC, TORCHELASTIC_HEALTH_CHECK_PORT, --rdzv_conf store_type and
// heartbeat_timeout.
#include <csignal>
#include <fstream>

#include <catch2/catch.hpp>

#include "common/error.h"
#include "launcher/cli.h"
#include "rendezvous/rounds/rendezvous_config.h"
#include "tests/launcher/parse_args.h"
#include "tests/support/scoped_env.h"
#include "tests/support/test_process.h"

using ddprun::UsageError;
using ddprun::launcher::parseCommandLine;
using ddprun::launcher::ParsedCommandLine;
using ddprun::testing::ScopedEnv;
using namespace std::chrono_literals;

namespace {

ParsedCommandLine parse(std::vector<std::string> args) {
  if (args.empty() || args.back() != "--help") {
    args.push_back("--no_python");
    args.push_back("true");
  }
  return ddprun::testing::parseArgs(std::move(args));
}

std::string usageErrorOf(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const UsageError& e) {
    std::string message = e.what();
    CHECK(message.find('\n') == std::string::npos);
    return message;
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("signals_to_handle: the flag then TORCHELASTIC_SIGNALS_TO_HANDLE then torchrun's list", "[cli]") {
  ScopedEnv no_env("TORCHELASTIC_SIGNALS_TO_HANDLE", std::nullopt);
  const std::vector<int> defaults{SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  CHECK(parse({}).config.stop_signals == defaults);
  CHECK(parse({"--signals-to-handle=SIGUSR1"}).config.stop_signals == std::vector<int>{SIGUSR1});
  CHECK(parse({"--signals_to_handle", "SIGTERM,SIGUSR2"}).config.stop_signals == std::vector<int>{SIGTERM, SIGUSR2});
  {
    ScopedEnv env("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGINT,SIGUSR1");
    CHECK(parse({}).config.stop_signals == std::vector<int>{SIGINT, SIGUSR1});
    CHECK(parse({"--signals_to_handle=SIGHUP"}).config.stop_signals == std::vector<int>{SIGHUP});
    ScopedEnv pet("PET_SIGNALS_TO_HANDLE", "SIGQUIT");
    CHECK(parse({}).config.stop_signals == std::vector<int>{SIGQUIT});
  }
  CHECK_THAT(usageErrorOf({"--signals_to_handle=SIGTERM,SIGFOO"}),
             Catch::Contains("--signals_to_handle") && Catch::Contains("'SIGFOO'"));
  ScopedEnv bad_env("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGKILL");
  CHECK_THAT(usageErrorOf({}), Catch::Contains("TORCHELASTIC_SIGNALS_TO_HANDLE") && Catch::Contains("'SIGKILL'"));
}

TEST_CASE("shutdown_timeout is term_timeout under torchrun's name", "[cli]") {
  ScopedEnv no_env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", std::nullopt);
  CHECK(parse({}).config.term_timeout == 30s);
  CHECK(parse({"--shutdown-timeout=5"}).config.term_timeout == 5s);
  CHECK(parse({"--shutdown_timeout", "120"}).config.term_timeout == 120s);
  CHECK(parse({"--term_timeout=7", "--shutdown_timeout=7.0"}).config.term_timeout == 7s);
  CHECK_THAT(usageErrorOf({"--term_timeout=7", "--shutdown_timeout=8"}),
             Catch::Contains("--term_timeout 7") && Catch::Contains("--shutdown_timeout 8"));
  CHECK_THAT(usageErrorOf({"--shutdown_timeout=-1"}), Catch::Contains("--shutdown_timeout"));
  {
    ScopedEnv pet("PET_SHUTDOWN_TIMEOUT", "9");
    CHECK(parse({}).config.term_timeout == 9s);
    CHECK_THAT(usageErrorOf({"--term_timeout=3"}), Catch::Contains("disagree"));
  }
  ScopedEnv env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "600");
  CHECK(parse({}).config.term_timeout == 600s);
  CHECK(parse({"--term_timeout=3"}).config.term_timeout == 3s);
  CHECK(parse({"--shutdown_timeout=4"}).config.term_timeout == 4s);
  ScopedEnv bad("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "soon");
  CHECK_THAT(usageErrorOf({}), Catch::Contains("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") && Catch::Contains("soon"));
}

TEST_CASE("PYTHON_EXEC names the interpreter and wins over PYTHON", "[cli]") {
  ddprun::testing::TempDir dir;
  std::string script = dir.file("train.py");
  std::ofstream(script) << "print('hi')\n";
  auto entrypointOf = [&] {
    const char* argv[] = {"ddprun", script.c_str()};
    return parseCommandLine(2, argv).config.entrypoint;
  };
  ScopedEnv python("PYTHON", "/nonexistent/python9");
  ScopedEnv exec("PYTHON_EXEC", "/bin/sh");
  CHECK(entrypointOf() == std::vector<std::string>{"/bin/sh", "-u", script});
  ScopedEnv missing("PYTHON_EXEC", "/nonexistent/python8");
  try {
    entrypointOf();
    FAIL("no error");
  } catch (const UsageError& e) {
    CHECK_THAT(e.what(), Catch::Contains("/nonexistent/python8") && Catch::Contains("$PYTHON_EXEC"));
  }
}

TEST_CASE("TORCHELASTIC_HEALTH_CHECK_PORT is the default health check port", "[cli]") {
  ScopedEnv no_env("TORCHELASTIC_HEALTH_CHECK_PORT", std::nullopt);
  CHECK_FALSE(parse({}).config.health_check_port);
  ScopedEnv env("TORCHELASTIC_HEALTH_CHECK_PORT", "0");
  CHECK(parse({}).config.health_check_port == 0);
  CHECK(parse({"--health_check_port=18080"}).config.health_check_port == 18080);
  ScopedEnv bad("TORCHELASTIC_HEALTH_CHECK_PORT", "http");
  CHECK_THAT(usageErrorOf({}), Catch::Contains("TORCHELASTIC_HEALTH_CHECK_PORT") && Catch::Contains("'http'"));
}

TEST_CASE("virtual_local_rank needs a device per local rank", "[cli]") {
  ScopedEnv no_devices("CUDA_VISIBLE_DEVICES", std::nullopt);
  CHECK_FALSE(parse({}).config.virtual_local_rank);
  CHECK(parse({"--virtual-local-rank", "--nproc_per_node=4"}).config.virtual_local_rank);
  CHECK(parse({"--virtual_local_rank"}).config.virtual_local_rank);
  ScopedEnv two("CUDA_VISIBLE_DEVICES", "3,5");
  CHECK(parse({"--virtual_local_rank", "--nproc_per_node=2"}).config.nproc_per_node == 2);
  CHECK_THAT(usageErrorOf({"--virtual_local_rank", "--nproc_per_node=3"}),
             Catch::Contains("--virtual_local_rank") && Catch::Contains("CUDA_VISIBLE_DEVICES='3,5'"));
}

// store_type is c10d's (torch's static rendezvous does not read it): --standalone is c10d.
TEST_CASE("rdzv_conf store_type takes tcp only and heartbeat_timeout bounds a keep-alive", "[cli]") {
  auto settingsOf = [](const std::string& conf) {
    return ddprun::rendezvous::parseRendezvousSettings(
        parse({"--standalone", "--rdzv_conf", conf}).config.rendezvous.conf);
  };
  CHECK_NOTHROW(settingsOf("store_type=tcp"));
  CHECK_NOTHROW(settingsOf("store_type= TCP "));
  CHECK(settingsOf("store_type=tcp").unknown_keys.empty());
  CHECK_THAT(usageErrorOf({"--standalone", "--rdzv_conf", "store_type=file"}),
             Catch::Equals("--rdzv_conf store_type=file: ddprun's rendezvous uses a TCP store only; "
                           "store_type=file is not supported"));
  CHECK_THAT(usageErrorOf({"--standalone", "--rdzv_conf", "store_type=etcd"}), Catch::Contains("store_type=etcd"));
  CHECK_FALSE(settingsOf("join_timeout=5").heartbeat_timeout);
  CHECK(settingsOf("heartbeat_timeout=2.5").heartbeat_timeout == 2500ms);
  CHECK(settingsOf("heartbeat_timeout=2").unknown_keys.empty());
  CHECK_THAT(usageErrorOf({"--rdzv_conf", "heartbeat_timeout=0"}), Catch::Contains("heartbeat_timeout=0"));
}

TEST_CASE("help lists torchrun's newer flags", "[cli]") {
  auto p = parse({"--help"});
  REQUIRE(p.help_text);
  for (const char* flag : {"--signals_to_handle", "--signals-to-handle", "--shutdown_timeout", "--shutdown-timeout",
                           "--virtual_local_rank", "--virtual-local-rank", "xpu"}) {
    CHECK_THAT(*p.help_text, Catch::Contains(flag));
  }
}
