// Cuts a byte stream into whole lines so that prefixed console output never splits a
// line or mixes two workers' lines. A line ends at '\n' (so "\r\n", a Windows-style
// end, is one end, even when the two bytes come in different reads); a bare '\r' ends
// nothing and stays inside its line. The terminator stays with its line. An unterminated
// tail is held until more bytes come, the stream ends (flush), or it grows past kMaxHeld,
// when it goes out as it is.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace ddprun::agent {

class LineSplitter {
 public:
  static constexpr size_t kMaxHeld = 1 << 20;
  using Emit = std::function<void(std::string_view line)>;

  // Calls `emit` for every line completed by `data`, in order.
  void feed(std::string_view data, const Emit& emit);
  // Emits whatever is held (the last, unterminated line) with a '\n' added.
  void flush(const Emit& emit);

 private:
  std::string held_;
};

}  // namespace ddprun::agent
