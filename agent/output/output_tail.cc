#include "agent/output/output_tail.h"

namespace ddprun::agent {

void OutputTail::add(std::string_view line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  if (line.size() > kMaxBytes) line = line.substr(line.size() - kMaxBytes);
  lines_.emplace_back(line);
  bytes_ += line.size();
  while (lines_.size() > kMaxLines || bytes_ > kMaxBytes) {
    bytes_ -= lines_.front().size();
    lines_.pop_front();
  }
}

std::string OutputTail::text() const {
  std::string out;
  for (const std::string& line : lines_) {
    out += line;
    out += '\n';
  }
  return out;
}

}  // namespace ddprun::agent
