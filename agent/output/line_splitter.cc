#include "agent/output/line_splitter.h"

namespace ddprun::agent {

void LineSplitter::feed(std::string_view data, const Emit& emit) {
  size_t start = 0;
  while (start < data.size()) {
    size_t end = data.find('\n', start);
    if (end == std::string_view::npos) {
      held_.append(data.substr(start));
      if (held_.size() >= kMaxHeld) {
        emit(held_);
        held_.clear();
      }
      return;
    }
    std::string_view piece = data.substr(start, end - start + 1);
    if (held_.empty()) {
      emit(piece);
    } else {
      held_.append(piece);
      emit(held_);
      held_.clear();
    }
    start = end + 1;
  }
}

void LineSplitter::flush(const Emit& emit) {
  if (held_.empty()) return;
  held_.push_back('\n');
  emit(held_);
  held_.clear();
}

}  // namespace ddprun::agent
