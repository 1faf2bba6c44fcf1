#include "launcher/program_resolver.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "common/env_names.h"
#include "common/error.h"

namespace ddprun::launcher {
namespace fs = std::filesystem;
namespace {

bool isExecutableFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

bool endsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string pythonInterpreter() {
  // torchrun reads PYTHON_EXEC; ddprun's older PYTHON stays as the fallback.
  const char* source = env::kPythonExec;
  const char* from_env = std::getenv(source);
  if (!from_env || !*from_env) {
    source = env::kPython;
    from_env = std::getenv(source);
  }
  const bool given = from_env && *from_env;
  std::string name = given ? from_env : "python3";
  std::string path = findExecutable(name);
  if (path.empty()) {
    throw UsageError("python interpreter '" + name + "' not found or not executable" +
                     (given ? " ($" + std::string(source) + ")" : " on PATH (set $PYTHON_EXEC to choose one)"));
  }
  return path;
}

// python, python3, python3.11 (a symlink counts by its own name, as a venv's python is one).
bool isPythonProgram(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  if (name.rfind("python", 0) != 0) return false;
  return name.find_first_not_of("0123456789.", 6) == std::string::npos;
}

}  // namespace

std::string findExecutable(const std::string& name) {
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) {
    return isExecutableFile(name) ? fs::absolute(name).lexically_normal().string() : "";
  }
  const char* path_env = std::getenv(env::kPath);
  std::string_view dirs = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    auto colon = dirs.find(':');
    std::string dir(dirs.substr(0, colon));
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (isExecutableFile(candidate)) return fs::absolute(candidate).lexically_normal().string();
    if (colon == std::string_view::npos) return "";
    dirs.remove_prefix(colon + 1);
  }
}

ResolvedProgram resolveProgram(const ProgramRequest& request) {
  ResolvedProgram resolved;
  const std::string& script = request.script;
  if (script.empty()) throw UsageError("no training script given (usage: ddprun [flags] training_script [args...])");

  auto withArgs = [&](std::vector<std::string> head) {
    head.insert(head.end(), request.args.begin(), request.args.end());
    return head;
  };

  if (request.run_path) {
    // torch runs the script with runpy.run_path in its agent's interpreter, before and instead
    // of --no_python and -m; ddprun's workers are processes of their own, so the closest is
    // the interpreter on the script, whatever its name. A directory or zip with a __main__.py
    // runs as runpy.run_path runs it.
    std::error_code ec;
    if (!fs::exists(script, ec)) throw UsageError("training script '" + script + "' not found (--run_path)");
    if (::access(script.c_str(), R_OK) != 0) throw UsageError("training script '" + script + "' is not readable");
    resolved.argv = withArgs({pythonInterpreter(), "-u", script});
    resolved.python = true;
    resolved.display_name = fs::path(script).filename().string();
    return resolved;
  }
  if (request.no_python) {
    if (request.module) throw UsageError("--no_python and -m/--module cannot be used together");
    std::string path = findExecutable(script);
    if (path.empty()) {
      bool exists = script.find('/') != std::string::npos && fs::exists(script);
      throw UsageError("program '" + script + "' " + (exists ? "is not executable" : "not found"));
    }
    resolved.argv = withArgs({path});
    resolved.python = isPythonProgram(path);
    resolved.display_name = fs::path(script).filename().string();
    return resolved;
  }
  if (request.module) {
    resolved.argv = withArgs({pythonInterpreter(), "-u", "-m", script});
    resolved.python = true;
    resolved.display_name = "-m " + script;
    return resolved;
  }
  const bool is_python_file = endsWith(script, ".py");
  if (!is_python_file) {
    // A program that is not a Python file runs directly, as a user replacing torchrun
    // would expect of `ddprun ... ./train_binary`.
    if (std::string path = findExecutable(script); !path.empty()) {
      resolved.argv = withArgs({path});
      resolved.python = isPythonProgram(path);
      resolved.display_name = fs::path(script).filename().string();
      return resolved;
    }
  }
  std::error_code ec;
  if (!fs::is_regular_file(script, ec)) throw UsageError("training script '" + script + "' not found");
  if (::access(script.c_str(), R_OK) != 0) throw UsageError("training script '" + script + "' is not readable");
  resolved.argv = withArgs({pythonInterpreter(), "-u", script});
  resolved.python = true;
  resolved.display_name = fs::path(script).filename().string();
  return resolved;
}

}  // namespace ddprun::launcher
