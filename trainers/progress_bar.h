// Rank 0's view of training: steps done, recent loss, samples per second and time left.
// On a terminal the bar redraws in place (at most ten times a second); anywhere else
// (ddprun's pipes, a log file) it prints one line every `every` steps and at the end, so
// logs stay readable:
//   step 300/1407 [######..............]  21% loss 0.4127  3391 samples/s  ETA 0:41
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace ddprun::trainers {

struct ProgressBarOptions {
  int64_t total_steps = 0;       // the run's last step
  int64_t first_step = 0;        // steps already done when the bar starts (a resumed run)
  int64_t samples_per_step = 0;  // the global batch size
  int64_t every = 50;            // lines mode: print every this many steps
  bool tty = false;              // redraw in place instead of printing lines
  std::FILE* out = stdout;
};

class ProgressBar {
 public:
  explicit ProgressBar(ProgressBarOptions options);

  // Records that `step` (1-based, global) finished with this rank's `loss`; draws or
  // prints when due. Not thread-safe.
  void update(int64_t step, double loss);
  // Prints a line above the bar (the bar is redrawn after it on a terminal).
  void message(const std::string& line);
  // Ends the bar's line on a terminal.
  void finish();

  // True when `fd` is a terminal and TERM is not "dumb".
  static bool isTerminal(int fd);

 private:
  std::string render(int64_t step, double loss) const;

  ProgressBarOptions options_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  double window_sum_ = 0.0;  // lines mode: mean loss since the previous line
  int64_t window_count_ = 0;
  double smoothed_ = 0.0;  // terminal mode: exponential moving average
  bool has_smoothed_ = false;
  bool drawn_ = false;
  std::string last_bar_;
};

}  // namespace ddprun::trainers
