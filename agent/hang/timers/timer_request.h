// torch's file timer protocol (torch.distributed.elastic.timer.FileTimerClient), as the
// agent reads it from the named pipe TORCHELASTIC_TIMER_FILE: one JSON object per line,
//   {"version": 1, "pid": 4242, "scope_id": "train_step", "expiration_time": 1700000000.5, "signal": 9}
// each written in one write(2) of at most PIPE_BUF bytes, so that lines of several
// writers never mix. expiration_time is wall-clock seconds since the epoch; a negative one
// releases the timer (pid, scope_id). A signal <= 0 asks for no kill when it expires.
// The parser reads the fields torch's FileTimerServer reads and ignores other keys; a
// line it cannot read is reported with the reason, never guessed at.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::agent {

struct TimerRequest {
  int64_t version = 1;
  int64_t pid = 0;             // the process to signal; > 0.
  std::string scope_id;        // names the timer, with the pid.
  double expiration_time = 0;  // seconds since the epoch; negative: a release.
  int signal = 0;              // sent when it expires; <= 0: none.

  bool isRelease() const { return expiration_time < 0; }
};

struct ParsedTimerRequest {
  std::optional<TimerRequest> request;  // set when the line is a request
  std::string error;                    // else why not ("no field 'pid'", "not JSON at byte 3: ...")
};

// Parses one line (without its newline). Never throws.
ParsedTimerRequest parseTimerRequest(std::string_view line);

// Cuts the bytes read from the pipe into request lines. A line longer than kMaxLine (a
// writer that broke the protocol; its bytes may be mixed with other writers') is not
// returned: its length is, so that the caller can say it ignored it.
class TimerLineBuffer {
 public:
  static constexpr size_t kMaxLine = 4096;  // PIPE_BUF on Linux; torch's client refuses longer requests.

  struct Line {
    std::string text;          // empty for an overlong line
    size_t overlong_size = 0;  // > 0: a line of this many bytes (at least) was dropped
  };

  // Returns the lines completed by `data`, in order. Empty lines are skipped.
  std::vector<Line> feed(std::string_view data);

 private:
  std::string held_;
  size_t dropping_ = 0;  // > 0 while skipping the rest of an overlong line: bytes skipped so far
};

}  // namespace ddprun::agent
