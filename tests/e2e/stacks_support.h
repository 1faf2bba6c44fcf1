// Helpers shared by the tests that find a hung worker's stacks (file timers, the hang verdict):
// where ddprun saved them in a log directory, and whether a stack tool is installed to take them.
#pragma once

#include <filesystem>
#include <string>

#include "tests/support/test_process.h"

namespace ddprun::testing {

// The one file whose path ends with `relative` under `dir`, at any depth; "" when there is none.
inline std::string findFile(const std::string& dir, const std::string& relative) {
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string path = entry.path().string();
    if (path.size() >= relative.size() && path.compare(path.size() - relative.size(), relative.size(), relative) == 0) {
      return path;
    }
  }
  return "";
}

// Whether eu-stack or gdb is installed (without either the stacks are a note, not frames).
inline bool stackToolInstalled() {
  return !run({"/bin/sh", "-c", "command -v eu-stack || command -v gdb"}).out.empty();
}

}  // namespace ddprun::testing
