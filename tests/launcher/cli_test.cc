#include <stdlib.h>
#include <unistd.h>

#include <fstream>

#include <catch2/catch.hpp>

#include "common/error.h"
#include "launcher/cli.h"
#include "launcher/program_resolver.h"
#include "rendezvous/rounds/rendezvous_config.h"
#include "tests/launcher/parse_args.h"
#include "tests/support/scoped_env.h"
#include "tests/support/test_process.h"

using ddprun::UsageError;
using ddprun::launcher::ParsedCommandLine;
using ddprun::testing::ScopedEnv;

namespace {

ParsedCommandLine parse(std::vector<std::string> args) { return ddprun::testing::parseArgs(std::move(args)); }

std::string trueProgram() { return ddprun::launcher::findExecutable("true"); }

std::string usageErrorOf(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("defaults match torchrun's", "[cli]") {
  auto p = parse({"--no_python", "true"});
  const auto& c = p.config;
  CHECK(c.nproc_per_node == 1);
  CHECK(c.rendezvous.min_nodes == 1);
  CHECK(c.rendezvous.max_nodes == 1);
  CHECK(c.rendezvous.backend == "static");
  CHECK(c.rendezvous.run_id == "none");
  CHECK(c.rendezvous.master_addr == "127.0.0.1");
  CHECK_FALSE(c.rendezvous.master_port.has_value());
  CHECK(c.max_restarts == 0);
  CHECK(c.monitor_interval == std::chrono::milliseconds(5000));
  CHECK(c.term_timeout == std::chrono::milliseconds(30000));
  CHECK(c.role == "default");
  CHECK_FALSE(c.log_dir.has_value());
  CHECK_FALSE(c.redirects.anyStream());
  CHECK_FALSE(c.tee.anyStream());
  CHECK(c.entrypoint == std::vector<std::string>{trueProgram()});
  CHECK(p.start_method == "spawn");
  // Not torchrun's: the health endpoint listens on loopback unless told otherwise.
  CHECK(c.health_check_addr == "127.0.0.1");
}

TEST_CASE("every flag is accepted in its underscore and its dash spelling", "[cli]") {
  ddprun::testing::TempDir logs;
  for (bool dashed : {false, true}) {
    auto flag = [&](std::string name) {
      if (dashed) {
        for (size_t i = 2; i < name.size(); ++i) {
          if (name[i] == '_') name[i] = '-';
        }
      }
      return name;
    };
    INFO("dashed spelling: " << dashed);
    auto p = parse({"--nnodes=1:4",
                    flag("--nproc_per_node") + "=3",
                    flag("--node_rank"),
                    "2",
                    flag("--master_addr") + "=10.1.2.3",
                    flag("--master_port") + "=29511",
                    flag("--rdzv_backend") + "=c10d",
                    flag("--rdzv_endpoint") + "=node0:29400",
                    flag("--rdzv_id") + "=job7",
                    flag("--rdzv_conf") + "=join_timeout=60,is_host=false",
                    flag("--max_restarts") + "=4",
                    flag("--monitor_interval") + "=0.5",
                    "--role=trainer",
                    flag("--log_dir") + "=" + logs.path(),
                    "--redirects=3",
                    "--tee=0:1,1:2",
                    flag("--local_ranks_filter") + "=0,2",
                    flag("--local_addr") + "=10.9.9.9",
                    flag("--start_method") + "=fork",
                    flag("--term_timeout") + "=2.5",
                    flag("--no_python"),
                    "true",
                    "a",
                    "--b"});
    const auto& c = p.config;
    CHECK(c.rendezvous.min_nodes == 1);
    CHECK(c.rendezvous.max_nodes == 4);
    CHECK(c.nproc_per_node == 3);
    CHECK(c.rendezvous.node_rank == 2);
    CHECK(c.rendezvous.master_addr == "10.1.2.3");
    CHECK(c.rendezvous.master_port == 29511);
    CHECK(c.rendezvous.backend == "c10d");
    CHECK(c.rendezvous.endpoint == "node0:29400");
    CHECK(c.rendezvous.run_id == "job7");
    CHECK(c.rendezvous.conf.at("join_timeout") == "60");
    CHECK(c.rendezvous.conf.at("is_host") == "false");
    CHECK(c.max_restarts == 4);
    CHECK(c.monitor_interval == std::chrono::milliseconds(500));
    CHECK(c.role == "trainer");
    CHECK(c.log_dir == logs.path());
    CHECK(c.redirects.forLocalRank(5) == ddprun::agent::Std::kAll);
    CHECK(c.tee.forLocalRank(0) == ddprun::agent::Std::kOut);
    CHECK(c.tee.forLocalRank(1) == ddprun::agent::Std::kErr);
    CHECK(c.tee.forLocalRank(2) == ddprun::agent::Std::kNone);
    CHECK(*c.local_ranks_filter == std::set<int>{0, 2});
    CHECK(c.rendezvous.local_addr == "10.9.9.9");
    CHECK(p.start_method == "fork");
    CHECK(c.term_timeout == std::chrono::milliseconds(2500));
    CHECK(c.entrypoint == std::vector<std::string>{trueProgram(), "a", "--b"});
  }
}

TEST_CASE("short flags -r, -t and -m", "[cli]") {
  auto p = parse({"-r", "1", "-t", "2", "--no_python", "true"});
  CHECK(p.config.redirects.forLocalRank(0) == ddprun::agent::Std::kOut);
  CHECK(p.config.tee.forLocalRank(0) == ddprun::agent::Std::kErr);
  ScopedEnv python("PYTHON", "/bin/sh");
  auto m = parse({"-m", "pkg.train", "--lr", "0.1"});
  CHECK(m.config.entrypoint == std::vector<std::string>{"/bin/sh", "-u", "-m", "pkg.train", "--lr", "0.1"});
  CHECK(m.config.entry_name == "-m pkg.train");
  auto m2 = parse({"--module", "pkg.train"});
  CHECK(m2.config.entrypoint[3] == "pkg.train");
}

TEST_CASE("standalone makes a single-node c10d job with a fresh run id", "[cli]") {
  auto a = parse({"--standalone", "--nproc-per-node=2", "--no-python", "true"});
  auto b = parse({"--standalone", "--no_python", "true"});
  CHECK(a.config.rendezvous.standalone);
  CHECK(a.config.rendezvous.backend == "c10d");
  CHECK(a.config.rendezvous.run_id.size() == 36);
  CHECK(a.config.rendezvous.run_id != b.config.rendezvous.run_id);
  CHECK(a.config.nproc_per_node == 2);
}

TEST_CASE("PET_ environment variables set flags and the command line wins", "[cli]") {
  ScopedEnv nproc("PET_NPROC_PER_NODE", "4");
  ScopedEnv restarts("PET_MAX_RESTARTS", "7");
  ScopedEnv standalone("PET_STANDALONE", "1");
  ScopedEnv no_python("PET_NO_PYTHON", "1");
  ScopedEnv tee("PET_TEE", "3");
  auto p = parse({"--max_restarts=2", "true"});
  CHECK(p.config.nproc_per_node == 4);
  CHECK(p.config.max_restarts == 2);
  CHECK(p.config.rendezvous.standalone);
  CHECK(p.config.entrypoint.front() == trueProgram());
  CHECK(p.config.tee.forLocalRank(0) == ddprun::agent::Std::kAll);
  ScopedEnv bad("PET_NNODES", "3:2");
  CHECK_THAT(usageErrorOf({"true"}), Catch::Contains("--nnodes") && Catch::Contains("3:2"));
}

TEST_CASE("nproc_per_node accepts auto, cpu and gpu", "[cli]") {
  ScopedEnv no_gpus("CUDA_VISIBLE_DEVICES", "");
  int cpus = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  CHECK(parse({"--nproc_per_node=cpu", "--no_python", "true"}).config.nproc_per_node == cpus);
  CHECK(parse({"--nproc_per_node=auto", "--no_python", "true"}).config.nproc_per_node == cpus);
  CHECK_THAT(usageErrorOf({"--nproc_per_node=gpu", "--no_python", "true"}), Catch::Contains("no GPU"));
  ScopedEnv two_gpus("CUDA_VISIBLE_DEVICES", "0,1");
  CHECK(parse({"--nproc_per_node=gpu", "--no_python", "true"}).config.nproc_per_node == 2);
  CHECK(parse({"--nproc_per_node=auto", "--no_python", "true"}).config.nproc_per_node == 2);
}

TEST_CASE("python scripts run under PYTHON -u and executables run directly", "[cli]") {
  ddprun::testing::TempDir dir;
  std::string script = dir.file("train.py");
  std::ofstream(script) << "print('hi')\n";
  ScopedEnv python("PYTHON", "/bin/sh");
  auto p = parse({script, "--epochs", "3"});
  CHECK(p.config.entrypoint == std::vector<std::string>{"/bin/sh", "-u", script, "--epochs", "3"});
  CHECK(p.config.entry_name == "train.py");
  std::string plain = dir.file("train_noext");
  std::ofstream(plain) << "print('hi')\n";
  CHECK(parse({"--run_path", plain}).config.entrypoint[2] == plain);
  CHECK(parse({plain}).config.entrypoint[2] == plain);  // not executable: a Python file, like torchrun
  CHECK(parse({"true"}).config.entrypoint == std::vector<std::string>{trueProgram()});
}

TEST_CASE("bad input is one clear error naming the problem", "[cli]") {
  ddprun::testing::TempDir dir;
  std::string not_executable = dir.file("data.txt");
  std::ofstream(not_executable) << "x";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--bogus", "true"}, "--bogus"},
      {{"--nnodes", "3:2", "--no_python", "true"}, "--nnodes"},
      {{"--nnodes", "0", "--no_python", "true"}, "--nnodes"},
      {{"--nnodes", "a:b", "--no_python", "true"}, "--nnodes"},
      {{"--nproc_per_node", "0", "--no_python", "true"}, "--nproc_per_node"},
      {{"--nproc_per_node", "abc", "--no_python", "true"}, "--nproc_per_node"},
      {{"--nproc_per_node", "-1", "--no_python", "true"}, "--nproc_per_node"},
      {{"--node_rank", "x", "--no_python", "true"}, "--node_rank"},
      {{"--nnodes=2", "--node_rank", "2", "--no_python", "true"}, "--node_rank"},
      {{"--master_port", "70000", "--no_python", "true"}, "--master_port"},
      {{"--rdzv_backend", "etcd", "--no_python", "true"}, "--rdzv_backend"},
      {{"--rdzv_backend", "c10d", "--no_python", "true"}, "--rdzv_endpoint"},
      {{"--rdzv_backend=c10d", "--rdzv_endpoint", ":29400", "--no_python", "true"}, "--rdzv_endpoint"},
      {{"--rdzv_backend=c10d", "--rdzv_endpoint", "h:99999", "--no_python", "true"}, "--rdzv_endpoint"},
      {{"--rdzv_conf", "timeout", "--no_python", "true"}, "--rdzv_conf"},
      {{"--rdzv_conf", "a=1,,b=2", "--no_python", "true"}, "--rdzv_conf"},
      {{"--rdzv_conf", "=1", "--no_python", "true"}, "--rdzv_conf"},
      {{"--rdzv_conf", "join_timeout=abc", "--no_python", "true"}, "join_timeout"},
      {{"--rdzv_conf", "keep_alive_max_attempt=0", "--no_python", "true"}, "keep_alive_max_attempt"},
      {{"--standalone", "--rdzv_conf", "is_host=maybe", "--no_python", "true"}, "is_host"},
      {{"--max_restarts", "-1", "--no_python", "true"}, "--max_restarts"},
      {{"--monitor_interval", "fast", "--no_python", "true"}, "--monitor_interval"},
      {{"--term_timeout", "-3", "--no_python", "true"}, "--term_timeout"},
      {{"--term_timeout", "1e30", "--no_python", "true"}, "--term_timeout"},
      {{"--node_cooldown", "1e300", "--no_python", "true"}, "--node_cooldown"},
      {{"--rdzv_conf", "join_timeout=1e16", "--no_python", "true"}, "join_timeout=1e16"},
      {{"--rdzv_conf", "keep_alive_interval=0.0001", "--no_python", "true"}, "keep_alive_interval=0.0001"},
      {{"--rdzv_conf", "keep_alive_interval=0.01", "--no_python", "true"}, "keep_alive_interval=0.01"},
      {{"--rdzv_conf", "last_call_timeout=0.0001", "--no_python", "true"}, "last_call_timeout=0.0001"},
      {{"--redirects", "4", "--no_python", "true"}, "--redirects"},
      {{"--redirects", "0:1,0:2", "--no_python", "true"}, "--redirects"},
      {{"--redirects", "0:1,", "--no_python", "true"}, "--redirects"},
      {{"-t", "x:1", "--no_python", "true"}, "--tee"},
      {{"--local_ranks_filter", "0,a", "--no_python", "true"}, "--local_ranks_filter"},
      {{"--start_method", "thread", "--no_python", "true"}, "--start_method"},
      {{"--standalone", "--nnodes=2", "--no_python", "true"}, "--standalone"},
      {{"--no_python", "no-such-program-ddprun"}, "no-such-program-ddprun"},
      {{"--no_python", not_executable}, "not executable"},
      {{dir.file("missing.py")}, "missing.py"},
      {{"--log_dir", not_executable + "/sub", "--no_python", "true"}, "--log_dir"},
      {{"--log_dir", "/proc/ddprun-cannot-write", "--no_python", "true"}, "--log_dir"},
      {{"--nproc_per_node=2"}, "no training script"},
  };
  for (const auto& [args, expected] : cases) {
    std::string message = usageErrorOf(args);
    INFO("args: " << Catch::Detail::stringify(args));
    CHECK_THAT(message, Catch::Contains(expected));
    CHECK(message.find('\n') == std::string::npos);
  }
}

TEST_CASE("a missing python interpreter is a usage error", "[cli]") {
  ddprun::testing::TempDir dir;
  std::string script = dir.file("train.py");
  std::ofstream(script) << "print('hi')\n";
  ScopedEnv python("PYTHON", "/nonexistent/python9");
  CHECK_THAT(usageErrorOf({script}), Catch::Contains("/nonexistent/python9"));
}

TEST_CASE("help reads like torchrun's", "[cli]") {
  auto p = parse({"--help"});
  REQUIRE(p.help_text);
  for (const char* flag : {"--nnodes", "--nproc_per_node", "--rdzv_backend", "--max_restarts", "--redirects", "--tee",
                           "--log_dir", "--standalone", "--no_python", "--term_timeout", "training_script"}) {
    CHECK_THAT(*p.help_text, Catch::Contains(flag));
  }
}

TEST_CASE("durations at the edges of their ranges are taken exactly", "[cli]") {
  auto c = parse({"--term_timeout=10000000", "--node_cooldown=0", "--rdzv_conf",
                  "join_timeout=10000000,keep_alive_interval=0.05,last_call_timeout=0.001", "--no_python", "true"})
               .config;
  CHECK(c.term_timeout == std::chrono::milliseconds(10000000000LL));
  CHECK(c.node_cooldown == std::chrono::milliseconds(0));
  auto settings = ddprun::rendezvous::parseRendezvousSettings(c.rendezvous.conf);
  CHECK(settings.join_timeout == std::chrono::milliseconds(10000000000LL));
  CHECK(settings.keep_alive_interval == std::chrono::milliseconds(50));
  CHECK(settings.last_call_timeout == std::chrono::milliseconds(1));
}

TEST_CASE("an option given as --name= takes the empty value and never the next argument", "[cli]") {
  // CLI11 alone took "--no_python" as the value of "--log_dir=" and made a directory of it.
  const auto parsed = parse({"--log_dir=", "--no_python", "--max_restarts=2", trueProgram(), "--log_dir="});
  const auto& c = parsed.config;
  CHECK_FALSE(c.log_dir.has_value());
  CHECK(c.max_restarts == 2);
  REQUIRE(c.entrypoint.size() == 2);
  CHECK(c.entrypoint[1] == "--log_dir=");  // the training script's own arguments are left alone
  CHECK(usageErrorOf({"--max_restarts=", "--no_python", "true"}).find("--max_restarts") != std::string::npos);
}

TEST_CASE("DDPRUN_NO_CGROUPS is a boolean and anything else is a usage error naming it", "[cli]") {
  const std::vector<std::string> args = {"--no_python", trueProgram()};
  {
    ScopedEnv unset("DDPRUN_NO_CGROUPS", std::nullopt);
    CHECK(parse(args).config.cgroups);
  }
  for (const char* on : {"", "0", "false", "no", "False", "NO"}) {
    INFO(on);
    ScopedEnv env("DDPRUN_NO_CGROUPS", on);
    CHECK(parse(args).config.cgroups);
  }
  for (const char* off : {"1", "true", "yes", "TRUE", "Yes"}) {
    INFO(off);
    ScopedEnv env("DDPRUN_NO_CGROUPS", off);
    CHECK_FALSE(parse(args).config.cgroups);
  }
  for (const char* bad : {"maybe", "2", " 1", "-1"}) {
    INFO(bad);
    ScopedEnv env("DDPRUN_NO_CGROUPS", bad);
    CHECK(usageErrorOf(args) ==
          std::string("DDPRUN_NO_CGROUPS=") + bad + ": not a boolean (1/0, true/false, yes/no, on/off)");
  }
}
