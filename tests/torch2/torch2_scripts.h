// What the torch 2.x tier's tests share: where their Python scripts are, and the environment
// that makes ddprun run .py programs with the interpreter under test (pythonPath():
// scripts/torch2-python when ctest runs them).
#pragma once

#include <map>
#include <string>

#include "tests/support/test_process.h"

namespace ddprun::testing {

// A script of tests/torch2/ by file name.
inline std::string torch2Script(const std::string& name) { return sourceDir() + "/tests/torch2/" + name; }

// ddprun's environment: PYTHON runs the workers' .py files.
inline std::map<std::string, std::string> torch2Env() { return {{"PYTHON", pythonPath()}}; }

}  // namespace ddprun::testing
