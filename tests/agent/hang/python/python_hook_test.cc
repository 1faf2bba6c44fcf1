#include "agent/hang/python/python_hook.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "common/env_names.h"
#include "common/error.h"
#include "tests/support/bounded_call.h"
#include "tests/support/test_process.h"

namespace ddprun::agent {
namespace {

using testing::BoundedCall;
using testing::callWithin;
using testing::TempDir;
using namespace std::chrono_literals;

TEST_CASE("torch's flight recorder variables are set under both names, into the run directory", "[unit]") {
  std::map<std::string, std::string> env;
  addTorchFlightRecorder(env, "/run/attempt_0/torch_trace_rank_");
  CHECK(env.at("TORCH_NCCL_TRACE_BUFFER_SIZE") == std::to_string(kTorchTraceEntries));
  CHECK(env.at("TORCH_FR_BUFFER_SIZE") == std::to_string(kTorchTraceEntries));
  CHECK(env.at("TORCH_NCCL_DUMP_ON_TIMEOUT") == "1");
  CHECK(env.at("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") == "/run/attempt_0/torch_trace_rank_");
  CHECK(env.at("TORCH_FR_DUMP_TEMP_FILE") == "/run/attempt_0/torch_trace_rank_");
}

TEST_CASE("what the user set of torch's flight recorder is kept, with the other name of its pair", "[unit]") {
  std::map<std::string, std::string> env = {{"TORCH_FR_BUFFER_SIZE", "0"},
                                            {"TORCH_NCCL_DUMP_ON_TIMEOUT", "0"},
                                            {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "/mine/"}};
  addTorchFlightRecorder(env, "/run/x_");
  CHECK(env.at("TORCH_FR_BUFFER_SIZE") == "0");
  CHECK_FALSE(env.count("TORCH_NCCL_TRACE_BUFFER_SIZE"));
  CHECK(env.at("TORCH_NCCL_DUMP_ON_TIMEOUT") == "0");
  CHECK(env.at("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") == "/mine/");
  CHECK_FALSE(env.count("TORCH_FR_DUMP_TEMP_FILE"));
}

TEST_CASE("the hook goes first on PYTHONPATH, before the user's", "[unit]") {
  std::map<std::string, std::string> env = {{"PYTHONPATH", "/user/lib"}};
  addPythonHook(env, "/run/python_hook", "/run/attempt_0/1");
  CHECK(env.at("PYTHONPATH") == "/run/python_hook:/user/lib");
  CHECK(env.at(env::kPythonStacksDir) == "/run/attempt_0/1");
  CHECK(env.at(env::kPythonStacksSignal) == std::to_string(kPythonStacksSignal));
  std::map<std::string, std::string> bare;
  addPythonHook(bare, "/run/python_hook", "/d");
  CHECK(bare.at("PYTHONPATH") == "/run/python_hook");
}

TEST_CASE("the hook is written, and the pids that registered it are found", "[unit]") {
  TempDir dir;
  writePythonHook(dir.path() + "/hook");
  std::ifstream in(dir.path() + "/hook/sitecustomize.py");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == pythonHookSource());
  std::ofstream(pythonStacksFile(dir.path(), 42)) << "";
  std::ofstream(pythonStacksFile(dir.path(), 7)) << "";
  std::ofstream(dir.path() + "/py_stacks.x") << "";
  CHECK(registeredPythonPids(dir.path()) == std::vector<pid_t>{7, 42});
  CHECK(readPythonException(dir.path()).empty());
  std::ofstream(pythonExceptionFile(dir.path(), 7)) << "Traceback (most recent call last):\n";
  CHECK(readPythonException(dir.path()) == "Traceback (most recent call last):\n");
}

TEST_CASE("a FIFO a worker left at py_exception.<pid> does not block the agent, and the real traceback is read",
          "[unit]") {
  TempDir dir;
  REQUIRE(::mkfifo(pythonExceptionFile(dir.path(), 9).c_str(), 0600) == 0);
  auto empty = [](const std::string& text) { return text.empty(); };
  CHECK(callWithin(
            10s, [&] { return readPythonException(dir.path()); }, empty) == BoundedCall::kReturned);
  // A traceback written before the FIFO was made is still found.
  std::ofstream(pythonExceptionFile(dir.path(), 7)) << "Traceback (most recent call last):\n";
  auto traceback = [](const std::string& text) { return text == "Traceback (most recent call last):\n"; };
  CHECK(callWithin(
            10s, [&] { return readPythonException(dir.path()); }, traceback) == BoundedCall::kReturned);
}

TEST_CASE("a FIFO, a link to /dev/zero or a huge file at py_stacks.<pid> is read without blocking, bounded", "[unit]") {
  TempDir dir;
  const std::string fifo = pythonStacksFile(dir.path(), 5);
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto empty = [](const std::string& text) { return text.empty(); };
  CHECK(callWithin(
            10s, [&] { return readSmallFile(fifo); }, empty) == BoundedCall::kReturned);
  const std::string zero = pythonStacksFile(dir.path(), 6);
  REQUIRE(::symlink("/dev/zero", zero.c_str()) == 0);
  CHECK(callWithin(
            10s, [&] { return readSmallFile(zero); }, empty) == BoundedCall::kReturned);
  const std::string big = pythonStacksFile(dir.path(), 8);
  std::ofstream(big) << std::string(3000, 'x');
  CHECK(readSmallFile(big, 1000) == std::string(1000, 'x'));
}

TEST_CASE("the hook is not written into a directory that is already there", "[unit]") {
  TempDir dir;
  // Another user's (or an earlier run's) directory, with a sitecustomize.py of its own.
  const std::string hook = dir.path() + "/hook";
  std::filesystem::create_directories(hook);
  std::ofstream(hook + "/sitecustomize.py") << "import os; os.system('theirs')\n";
  CHECK_THROWS_AS(writePythonHook(hook), SystemError);
  CHECK_THROWS_WITH(writePythonHook(hook), Catch::Contains(hook) && Catch::Contains("File exists"));
  std::ifstream in(hook + "/sitecustomize.py");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "import os; os.system('theirs')\n");
  // A link to a directory is not followed either.
  std::filesystem::create_directory_symlink(hook, dir.path() + "/link");
  CHECK_THROWS_AS(writePythonHook(dir.path() + "/link"), SystemError);
  // Made here, it is private to the user.
  writePythonHook(dir.path() + "/fresh");
  struct stat st {};
  REQUIRE(::stat((dir.path() + "/fresh").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
}

}  // namespace
}  // namespace ddprun::agent
