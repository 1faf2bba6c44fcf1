#include "agent/hang/python_hook.h"

#include <fstream>

#include <catch2/catch.hpp>

#include "common/env_names.h"
#include "tests/support/test_process.h"

namespace ddprun::agent {
namespace {

using testing::TempDir;

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

}  // namespace
}  // namespace ddprun::agent
