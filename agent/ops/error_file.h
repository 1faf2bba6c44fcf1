// Reading a worker's TORCHELASTIC_ERROR_FILE. The format is the one torch's
// @record decorator writes (and ddprun's worker runtime writes from C++):
//   {"message": {"message": "ValueError: ...",
//                "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1700000000"}}}
// A bare {"message": "text"} is accepted too.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace ddprun::agent {

struct WorkerErrorRecord {
  std::string message;
  std::string traceback;            // py_callstack, or a C++ backtrace; may be empty.
  std::optional<double> timestamp;  // seconds since the epoch, when the file has one.
};

// The most of an error file read: a traceback of thousands of frames fits many times.
inline constexpr size_t kMaxErrorFileBytes = size_t{4} << 20;

// Returns nothing when the file does not exist or is empty (the worker wrote no error).
// A file that exists but cannot be parsed yields a record whose message says so, so a
// report never hides that the worker tried to say something; so does one that is not a
// regular file (a FIFO, a device, a symbolic link: never opened for a blocking read) or
// holds more than kMaxErrorFileBytes. Never blocks, never throws.
std::optional<WorkerErrorRecord> readErrorFile(const std::string& path);

}  // namespace ddprun::agent
