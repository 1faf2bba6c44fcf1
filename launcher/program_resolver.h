// Turning "training_script [args...]" into the worker's argv, the way torchrun does:
// Python scripts (and -m modules, and --run_path) run under `python -u`; --no_python
// and other executables run directly.
#pragma once

#include <string>
#include <vector>

namespace ddprun::launcher {

struct ProgramRequest {
  std::string script;             // the training_script positional.
  std::vector<std::string> args;  // everything after it.
  bool no_python = false;         // --no_python.
  bool module = false;            // -m/--module.
  bool run_path = false;          // --run_path: python on the script, before --no_python and -m.
};

struct ResolvedProgram {
  std::vector<std::string> argv;  // argv[0] absolute.
  std::string display_name;       // for reports: "train.py", "-m pkg.mod", "true".
  bool python = false;            // the program is a Python interpreter (ddprun's, or python* itself).
};

// Finds `name` on PATH (or checks it as a path when it contains '/'); returns the
// absolute path of an executable regular file, or "" when there is none.
std::string findExecutable(const std::string& name);

// Throws UsageError when the program or the Python interpreter is missing or not
// executable. The interpreter is $PYTHON_EXEC (torchrun's name), else $PYTHON, else
// python3 on PATH.
ResolvedProgram resolveProgram(const ProgramRequest& request);

}  // namespace ddprun::launcher
