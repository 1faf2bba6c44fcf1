// A spare worker's assignment (--recovery=in-job's warm spare; common/recovery_keys.h): what
// the agent writes to the spare's pipe to make it the replacement of a failed rank, and its
// one reading, in the spare's runtime (worker_runtime/spare_wait.h). The assignment is the
// difference between the spare's environment and the one a started replacement would get, so
// that the spare runs with exactly that environment, whatever the contract holds.
//
// Wire: entries, each ending in a NUL byte: "NAME=VALUE" sets NAME (a name never holds '='
// nor NUL, a value never NUL), "NAME" unsets it; an empty entry ends the assignment.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::recovery {

struct SpareAssignment {
  std::vector<std::pair<std::string, std::string>> set;  // NAME, VALUE
  std::vector<std::string> unset;
};

// The assignment that turns environment `spare` into `worker`. Throws UsageError naming the
// variable when a name is empty or holds '=' or NUL, or a value holds NUL (the wire could not
// carry it).
std::string encodeSpareAssignment(const std::map<std::string, std::string>& spare,
                                  const std::map<std::string, std::string>& worker);

// Reads bytes as they arrive from the pipe. Thread-safety: none.
class SpareAssignmentReader {
 public:
  // Takes the next bytes read; returns the assignment once its ending entry arrived (bytes
  // after it are ignored). Throws UsageError on an entry "=VALUE" (no name).
  std::optional<SpareAssignment> add(std::string_view bytes);

 private:
  std::string pending_;  // the entry not yet ended
  SpareAssignment assignment_;
  bool done_ = false;
};

}  // namespace ddprun::recovery
