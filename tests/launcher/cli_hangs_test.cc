// The command line of hung-job handling: file timers from the environment, Python
// workers known as such, and the faulthandler opt-out.
#include <sys/stat.h>

#include <fstream>

#include <catch2/catch.hpp>

#include "launcher/program_resolver.h"
#include "tests/launcher/parse_args.h"
#include "tests/support/scoped_env.h"
#include "tests/support/test_process.h"

using ddprun::testing::parseArgs;
using ddprun::testing::ScopedEnv;

TEST_CASE("file timers are on only with TORCHELASTIC_ENABLE_FILE_TIMER=1 as in torch", "[cli]") {
  {
    ScopedEnv off("TORCHELASTIC_ENABLE_FILE_TIMER", std::nullopt);
    CHECK_FALSE(parseArgs({"--no_python", "true"}).config.file_timer);
  }
  {
    ScopedEnv on("TORCHELASTIC_ENABLE_FILE_TIMER", "1");
    CHECK(parseArgs({"--no_python", "true"}).config.file_timer);
  }
  {
    ScopedEnv other("TORCHELASTIC_ENABLE_FILE_TIMER", "true");
    CHECK_FALSE(parseArgs({"--no_python", "true"}).config.file_timer);
  }
}

TEST_CASE("workers are Python when ddprun runs the interpreter or the program is one", "[cli]") {
  ddprun::testing::TempDir dir;
  const std::string script = dir.file("train.py");
  std::ofstream(script) << "print('hi')\n";
  ScopedEnv python("PYTHON", "/bin/sh");
  CHECK(parseArgs({script}).config.python_workers);
  CHECK(parseArgs({"-m", "pkg.train"}).config.python_workers);
  CHECK_FALSE(parseArgs({"--no_python", "true"}).config.python_workers);
  for (const char* name : {"python3", "python3.11", "python"}) {
    const std::string interpreter = dir.file(name);
    std::ofstream(interpreter) << "#!/bin/sh\n";
    ::chmod(interpreter.c_str(), 0755);
    INFO(name);
    CHECK(parseArgs({"--no_python", interpreter, script}).config.python_workers);
  }
  const std::string lookalike = dir.file("python-wrapper");
  std::ofstream(lookalike) << "#!/bin/sh\n";
  ::chmod(lookalike.c_str(), 0755);
  CHECK_FALSE(parseArgs({"--no_python", lookalike}).config.python_workers);
}

TEST_CASE("the flag --no_python_faulthandler turns the faulthandler off", "[cli]") {
  CHECK(parseArgs({"--no_python", "true"}).config.python_faulthandler);
  CHECK_FALSE(parseArgs({"--no_python_faulthandler", "--no_python", "true"}).config.python_faulthandler);
  CHECK_FALSE(parseArgs({"--no-python-faulthandler", "--no_python", "true"}).config.python_faulthandler);
  ScopedEnv pet("PET_NO_PYTHON_FAULTHANDLER", "1");
  CHECK_FALSE(parseArgs({"--no_python", "true"}).config.python_faulthandler);
}

TEST_CASE("hang_timeout is off unless given and takes positive seconds", "[cli]") {
  CHECK_FALSE(parseArgs({"--no_python", "true"}).config.hang_timeout);
  auto config = parseArgs({"--hang_timeout", "2.5", "--no_python", "true"}).config;
  REQUIRE(config.hang_timeout);
  CHECK(config.hang_timeout->count() == 2500);
  CHECK(parseArgs({"--hang-timeout=600", "--no_python", "true"}).config.hang_timeout->count() == 600000);
  CHECK_THROWS_WITH(parseArgs({"--hang_timeout", "0", "--no_python", "true"}),
                    Catch::Contains("--hang_timeout must be more than 0 seconds"));
  CHECK_THROWS_WITH(parseArgs({"--hang_timeout", "soon", "--no_python", "true"}), Catch::Contains("--hang_timeout"));
}
