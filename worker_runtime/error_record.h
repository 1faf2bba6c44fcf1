// Reporting a worker's fatal error to the launcher: the JSON file named by
// TORCHELASTIC_ERROR_FILE, in the format torch's @record writes, so ddprun's (and
// torchrun's) failure report shows the message and where it came from.
#pragma once

#include <functional>
#include <string>

namespace ddprun::runtime {

// Writes {"message": {"message": ..., "extraInfo": {"py_callstack": ..., "timestamp": ...}}}
// to TORCHELASTIC_ERROR_FILE (nothing when it is unset). Returns false when the file
// cannot be written. Does not throw.
bool writeErrorFile(const std::string& message, const std::string& traceback);

// Runs `body`; an exception escaping it is printed to stderr, written to the error file
// and turned into exit code 1. Use at the top of main: `return recordErrors([&] { ... });`
int recordErrors(const std::function<int()>& body);

}  // namespace ddprun::runtime
