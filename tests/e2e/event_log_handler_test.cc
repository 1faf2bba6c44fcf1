// --event_log_handler=console through the real binary: the agent's events, one JSON line each on
// stderr, the same lines as its events file, as torch's console handler writes its events.
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

std::vector<std::string> eventLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("{\"time\":", 0) == 0) lines.push_back(line);
  }
  return lines;
}

std::string eventsFileOf(const std::string& log_dir) {
  auto r = run({"/bin/sh", "-c", "cat " + log_dir + "/*/events.jsonl"});
  return r.out;
}

}  // namespace

TEST_CASE("event_log_handler console writes each event as one line on stderr", "[e2e][events]") {
  for (const bool from_env : {false, true}) {
    TempDir dir;
    std::vector<std::string> argv{ddprunPath(), "--standalone", "--log-dir", dir.path()};
    std::map<std::string, std::string> env;
    if (from_env) {
      env["PET_EVENT_LOG_HANDLER"] = "console";
    } else {
      argv.push_back("--event-log-handler=console");
    }
    argv.insert(argv.end(), {"--no_python", "true"});
    auto r = run(argv, env, 60s);
    INFO(r.err);
    REQUIRE(r.finished);
    CHECK(r.exit_code == 0);
    const std::vector<std::string> console = eventLines(r.err);
    CHECK(console == eventLines(eventsFileOf(dir.path())));
    CHECK_THAT(r.err, Catch::Contains("\"event\":\"agent_start\"") && Catch::Contains("\"event\":\"worker_exit\"") &&
                          Catch::Contains("\"event\":\"agent_exit\""));
    CHECK(eventLines(r.out).empty());
  }
}

TEST_CASE("event_log_handler null, the default, keeps events off the console", "[e2e][events]") {
  for (const std::vector<std::string>& flag : {std::vector<std::string>{}, {"--event_log_handler", "null"}}) {
    TempDir dir;
    std::vector<std::string> argv{ddprunPath(), "--standalone", "--log_dir", dir.path()};
    argv.insert(argv.end(), flag.begin(), flag.end());
    argv.insert(argv.end(), {"--no_python", "true"});
    auto r = run(argv, {{"PET_EVENT_LOG_HANDLER", ""}}, 60s);
    REQUIRE(r.finished);
    CHECK(r.exit_code == 0);
    CHECK(eventLines(r.err).empty());
    CHECK_FALSE(eventLines(eventsFileOf(dir.path())).empty());
  }
}
