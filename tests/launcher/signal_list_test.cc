#include <csignal>

#include <catch2/catch.hpp>

#include "common/error.h"
#include "launcher/signal_list.h"

using ddprun::UsageError;
using ddprun::launcher::parseSignalList;

namespace {

std::string errorOf(std::string_view text) {
  try {
    parseSignalList("--signals_to_handle", text);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("the default signal list is torchrun's", "[signals][unit]") {
  CHECK(parseSignalList("--signals_to_handle", ddprun::launcher::kDefaultSignalsToHandle) ==
        std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT});
}

TEST_CASE("signal names ignore case and blanks and repeats collapse", "[signals][unit]") {
  CHECK(parseSignalList("x", "SIGUSR1") == std::vector<int>{SIGUSR1});
  CHECK(parseSignalList("x", " sigterm , SIGusr2,SIGTERM") == std::vector<int>{SIGTERM, SIGUSR2});
}

TEST_CASE("a bad signal list is one line naming the culprit", "[signals][unit]") {
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {"SIGTERM,SIGBOGUS", "'SIGBOGUS'"},
           {"TERM", "'TERM'"},
           {"SIGKILL", "'SIGKILL'"},
           {"SIGCHLD", "'SIGCHLD'"},
           {"15", "'15'"},
           {"SIGTERM,,SIGINT", "comma-separated"},
           {"", "comma-separated"},
       }) {
    INFO("text: " << text);
    std::string message = errorOf(text);
    CHECK_THAT(message, Catch::Contains("--signals_to_handle") && Catch::Contains(expected));
    CHECK(message.find('\n') == std::string::npos);
  }
}
