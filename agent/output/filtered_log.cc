#include "agent/output/filtered_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/logging.h"
#include "common/worker_file.h"

namespace ddprun::agent {

std::vector<std::string> parseFilterList(std::string_view flag, std::string_view text) {
  std::vector<std::string> filters;
  if (text.empty()) return filters;
  std::string item;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] != ',') {
      item += text[i];
      continue;
    }
    // Pairs are read left to right, as torchrun's replace(",,", ...) does: ",,," is a
    // literal comma followed by a separator.
    if (i + 1 < text.size() && text[i + 1] == ',') {
      item += ',';
      ++i;
      continue;
    }
    if (item.empty()) {
      throw UsageError("invalid " + std::string(flag) + " value '" + std::string(text) +
                       "': empty filter (it would match every line); write ,, for a literal comma");
    }
    filters.push_back(std::move(item));
    item.clear();
  }
  return filters;
}

FilteredLog::FilteredLog(std::string path, std::vector<std::string> filters)
    : path_(std::move(path)), filters_(std::move(filters)) {
  // In the attempt's directory, which workers can write into: never through a FIFO or a link.
  std::string reason;
  fd_ = createWorkerFile(path_, O_TRUNC | O_APPEND, 0644, &reason);
  if (!fd_) logger("agent")->warn("cannot open {}: {}; filtered lines are not saved", path_, reason);
}

FilteredLog::~FilteredLog() = default;

void FilteredLog::offer(std::string_view prefix, std::string_view line) {
  if (!fd_) return;
  bool match = false;
  for (const std::string& filter : filters_) {
    if (line.find(filter) != std::string_view::npos) {
      match = true;
      break;
    }
  }
  if (!match) return;
  out_.assign(prefix);
  out_.append(line);
  std::string_view rest(out_);
  while (!rest.empty()) {
    ssize_t n = ::write(fd_.get(), rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      logger("agent")->warn("cannot write {}: {}; the rest of the filtered lines are not saved", path_,
                            std::strerror(err));
      fd_.reset();
      return;
    }
    rest.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace ddprun::agent
