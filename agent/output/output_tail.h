// The last lines of a worker stream, kept in memory for the failure report: when the log
// file is unusable (a full --log_dir) they are the only record of the worker's last words.
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>

namespace ddprun::agent {

class OutputTail {
 public:
  static constexpr size_t kMaxLines = 20;
  static constexpr size_t kMaxBytes = 8192;

  // Adds one line (its terminator, if any, is dropped). A line longer than kMaxBytes keeps
  // its end. Not thread-safe.
  void add(std::string_view line);
  // The kept lines, oldest first, each ending in '\n'; at most kMaxLines lines and
  // kMaxBytes bytes of text (terminators aside).
  std::string text() const;
  size_t lines() const { return lines_.size(); }

 private:
  std::deque<std::string> lines_;
  size_t bytes_ = 0;
};

}  // namespace ddprun::agent
