// --duplicate_stdout_filters / --duplicate_stderr_filters: one file per stream and attempt
// (attempt_<k>/filtered_stdout.log, filtered_stderr.log) that gets a copy of every line,
// from every teed worker, that contains any of the filters. Lines keep their console
// prefix ("[rank3]:"), so the file, aggregated across ranks as torchrun's is, still says
// who wrote what.
//
// Written from the agent's io_context thread only (not thread-safe), one write per line so
// that lines of different workers never interleave. A file that cannot be written is
// warned about once and then left alone; the workers never notice.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/unique_fd.h"

namespace ddprun::agent {

// torchrun's comma_separated_list: items split at ',', where ",," stands for a literal
// comma. "" is no filter at all. Throws UsageError naming `flag` for an empty item (it
// would match every line).
std::vector<std::string> parseFilterList(std::string_view flag, std::string_view text);

class FilteredLog {
 public:
  // Creates or truncates `path`. A file that cannot be opened is warned about; offer()
  // then does nothing.
  FilteredLog(std::string path, std::vector<std::string> filters);
  ~FilteredLog();
  FilteredLog(const FilteredLog&) = delete;
  FilteredLog& operator=(const FilteredLog&) = delete;

  // Appends prefix + line when `line` (with its terminator) contains any filter.
  void offer(std::string_view prefix, std::string_view line);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> filters_;
  UniqueFd fd_;
  std::string out_;
};

}  // namespace ddprun::agent
