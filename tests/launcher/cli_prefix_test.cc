// argparse's reading of long flags (issue 45): a unique prefix names its flag, an exact name
// wins, an ambiguous prefix is refused with its candidates; and torch 2.x's --logs_specs,
// --event_log_handler and --run_path.
#include <fstream>

#include <catch2/catch.hpp>

#include "common/error.h"
#include "launcher/status_command.h"
#include "tests/launcher/parse_args.h"
#include "tests/support/scoped_env.h"
#include "tests/support/test_process.h"

using ddprun::UsageError;
using ddprun::launcher::ParsedCommandLine;
using ddprun::testing::parseArgs;
using ddprun::testing::ScopedEnv;

namespace {

std::string usageErrorOf(std::vector<std::string> args) {
  try {
    parseArgs(std::move(args));
  } catch (const UsageError& e) {
    std::string message = e.what();
    CHECK(message.find('\n') == std::string::npos);
    return message;
  }
  return "<no error>";
}

std::string value(const std::vector<std::string>& args, const std::string& flag) {
  return parseArgs(args).flag_values.at(flag);
}

}  // namespace

TEST_CASE("a unique prefix of a long flag names that flag in either spelling", "[cli][prefix]") {
  CHECK(value({"--redirect=3", "--no_python", "true"}, "--redirects") == "3");
  CHECK(value({"--redir", "2", "--no_python", "true"}, "--redirects") == "2");
  CHECK(parseArgs({"--nproc=2", "--no_python", "true"}).config.nproc_per_node == 2);
  CHECK(parseArgs({"--nproc-per=3", "--no_python", "true"}).config.nproc_per_node == 3);
  CHECK(parseArgs({"--nproc_per", "4", "--no_python", "true"}).config.nproc_per_node == 4);
  CHECK(parseArgs({"--max=2", "--no_python", "true"}).config.max_restarts == 2);
  CHECK(parseArgs({"--stand", "--no_python", "true"}).config.rendezvous.standalone);
  // A flag's prefix, and an empty value kept empty (argparse's "--log-d=").
  CHECK(value({"--no-pyth", "true"}, "--no_python") == "true");
  CHECK(value({"--rdzv-c=", "--no_python", "true"}, "--rdzv_conf").empty());
}

TEST_CASE("torchrun's flag wins a prefix it shares only with ddprun's own flags", "[cli][prefix]") {
  // --no-py is also --no_python_faulthandler and --no_python_stacks; --node is also
  // --node_cooldown(_max): torchrun has one flag there, and means it.
  CHECK(value({"--no-py", "true"}, "--no_python") == "true");
  CHECK(value({"--no-py", "true"}, "--no_python_stacks") == "false");
  CHECK(parseArgs({"--nnodes=2", "--node=1", "--no_python", "true"}).config.rendezvous.node_rank == 1);
}

TEST_CASE("an exact name wins over the longer names it begins", "[cli][prefix]") {
  auto c = parseArgs({"--node_cooldown=5", "--no_python", "true"}).config;
  CHECK(c.node_cooldown == std::chrono::seconds(5));
  CHECK(c.node_cooldown_max == std::chrono::seconds(300));
  CHECK(value({"--no_python", "true"}, "--no_python_stacks") == "false");
}

TEST_CASE("an ambiguous prefix is refused in one line naming the candidates", "[cli][prefix]") {
  CHECK(usageErrorOf({"--rdzv=x", "--no_python", "true"}) ==
        "ambiguous option: --rdzv=x could match --rdzv_backend, --rdzv-backend, --rdzv_endpoint, --rdzv-endpoint, "
        "--rdzv_id, --rdzv-id, --rdzv_conf, --rdzv-conf");
  CHECK_THAT(usageErrorOf({"--log", "/tmp", "--no_python", "true"}),
             Catch::StartsWith("ambiguous option: --log could match --log_dir, --log-dir, --logs_specs"));
  // Among ddprun's own flags only.
  CHECK_THAT(usageErrorOf({"--node_cool=1", "--no_python", "true"}),
             Catch::StartsWith("ambiguous option: --node_cool=1 could match --node_cooldown,"));
  CHECK_THAT(usageErrorOf({"--node_cool=1", "--no_python", "true"}), Catch::Contains("--node_cooldown_max"));
}

TEST_CASE("prefixes end at the training script", "[cli][prefix]") {
  ddprun::testing::TempDir dir;
  const std::string script = dir.file("train.py");
  std::ofstream(script) << "\n";
  auto p = parseArgs({"--redirect=1", script, "--redirect=2", "--rdzv=x"});
  CHECK(p.flag_values.at("--redirects") == "1");
  const auto& argv = p.config.entrypoint;
  REQUIRE(argv.size() >= 2);
  CHECK(std::vector<std::string>(argv.end() - 2, argv.end()) == std::vector<std::string>{"--redirect=2", "--rdzv=x"});
  // A value that looks like a prefix is a value.
  CHECK(parseArgs({"--role", "--redir", "--no_python", "true"}).config.role == "--redir");
}

TEST_CASE("status takes prefixes and refuses ambiguous ones", "[cli][prefix]") {
  const char* ambiguous[] = {"ddprun", "status", "--rdzv=x"};
  try {
    ddprun::launcher::runStatusCommand(3, ambiguous);
    FAIL("no error");
  } catch (const UsageError& e) {
    CHECK_THAT(e.what(), Catch::StartsWith("status: ambiguous option: --rdzv=x could match --rdzv_endpoint,"));
  }
  // --rdzv_i and --rdzv-e are unique: the missing flag is the only complaint left.
  const char* prefixed[] = {"ddprun", "status", "--rdzv_i=job", "--js"};
  try {
    ddprun::launcher::runStatusCommand(4, prefixed);
    FAIL("no error");
  } catch (const UsageError& e) {
    CHECK_THAT(e.what(), Catch::Contains("needs --rdzv_endpoint"));
  }
}

TEST_CASE("logs_specs takes torch's default and names a missing entry point", "[cli]") {
  CHECK(value({"--no_python", "true"}, "--logs_specs").empty());
  CHECK(value({"--logs-specs=default", "--no_python", "true"}, "--logs_specs") == "default");
  CHECK(value({"--logs_specs", "default", "--no_python", "true"}, "--logs_specs") == "default");
  CHECK_THAT(usageErrorOf({"--logs-specs=s3_logs", "--no_python", "true"}),
             Catch::StartsWith("could not find entry point under 'torchrun.logs_specs[s3_logs]'"));
  // torch has no PET_LOGS_SPECS: an exported one changes nothing.
  ScopedEnv pet("PET_LOGS_SPECS", "s3_logs");
  CHECK(value({"--no_python", "true"}, "--logs_specs").empty());
}

TEST_CASE("event_log_handler takes null and console, also from PET_EVENT_LOG_HANDLER", "[cli]") {
  ScopedEnv no_pet("PET_EVENT_LOG_HANDLER", std::nullopt);
  CHECK_FALSE(parseArgs({"--no_python", "true"}).config.events_console);
  CHECK_FALSE(parseArgs({"--event_log_handler=null", "--no_python", "true"}).config.events_console);
  CHECK(parseArgs({"--event-log-handler", "console", "--no_python", "true"}).config.events_console);
  CHECK(usageErrorOf({"--event_log_handler=kafka", "--no_python", "true"}) ==
        "invalid --event_log_handler value 'kafka': expected null or console (torch's registered handlers)");
  ScopedEnv pet("PET_EVENT_LOG_HANDLER", "console");
  CHECK(parseArgs({"--no_python", "true"}).config.events_console);
  CHECK_FALSE(parseArgs({"--event_log_handler=null", "--no_python", "true"}).config.events_console);
}

TEST_CASE("run_path runs the script with python before no_python and module", "[cli]") {
  ddprun::testing::TempDir dir;
  const std::string script = dir.file("train_no_suffix");
  std::ofstream(script) << "print('hi')\n";
  ScopedEnv python("PYTHON_EXEC", "/bin/sh");
  for (const auto& extra : std::vector<std::vector<std::string>>{{}, {"--no_python"}, {"-m"}, {"--no-python", "-m"}}) {
    std::vector<std::string> args{"--run-path"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back(script);
    args.push_back("--epochs=1");
    INFO(Catch::Detail::stringify(args));
    CHECK(parseArgs(args).config.entrypoint == std::vector<std::string>{"/bin/sh", "-u", script, "--epochs=1"});
  }
  CHECK_THAT(usageErrorOf({"--run_path", dir.file("missing.py")}), Catch::Contains("missing.py"));
}
