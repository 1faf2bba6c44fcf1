// ddprun's console: what it prints to stdout and stderr while it runs (teed worker lines,
// its own log lines, the failure report) goes through one writer thread with a bounded
// queue, so that a console nobody reads (a stalled `| less`, a log shipper, Ctrl-S) never
// blocks signal handling or worker supervision. The descriptors stay blocking: workers
// share their open file descriptions, and O_NONBLOCK would reach them too.
//
// When the queue is full, whole lines are dropped and counted. The count is reported
// through a callback once the console moves again (at most once per report interval) and
// at the end (finish()); log files are written elsewhere and are not affected.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <thread>

namespace ddprun {

enum class ConsoleStream { kStdout, kStderr };

class ConsoleWriter {
 public:
  struct Options {
    int stdout_fd = 1;                  // where kStdout goes; default STDOUT_FILENO.
    int stderr_fd = 2;                  // where kStderr goes; default STDERR_FILENO.
    size_t capacity = size_t{4} << 20;  // most bytes queued at once; default 4 MiB.
    // The least time between two drop reports; default 10 s.
    std::chrono::milliseconds report_interval{10000};
    // Told how many lines were dropped since the last report; default: nobody. Called
    // without locks held, from the writer thread or from finish(); it may write() itself.
    std::function<void(uint64_t dropped)> on_dropped;
  };

  static constexpr std::chrono::milliseconds kDestroyTimeout{2000};

  // Starts the writer thread. Throws std::system_error if it cannot.
  explicit ConsoleWriter(Options options);
  // finish(kDestroyTimeout), then stops the thread. A thread still stuck in a write is left
  // behind (it owns what it uses) rather than holding up the caller.
  ~ConsoleWriter();
  ConsoleWriter(const ConsoleWriter&) = delete;
  ConsoleWriter& operator=(const ConsoleWriter&) = delete;

  // Queues `text` (one or more whole lines) for `stream`. Never blocks on the console:
  // when the queue has no room, drops `text`, counts its lines and returns false.
  // Thread-safe.
  bool write(ConsoleStream stream, std::string_view text);

  // Blocks until everything queued before the call is written, or `timeout` passes.
  // Returns whether it was all written. Thread-safe.
  bool flush(std::chrono::milliseconds timeout);

  // For the end of the program: reports the lines dropped and not yet reported, then
  // flushes for at most `timeout`. No drop report comes after it. Returns what flush()
  // returns. Thread-safe.
  bool finish(std::chrono::milliseconds timeout);

  // Lines dropped since the start. Thread-safe.
  uint64_t droppedLines() const;

 private:
  struct State;
  static void run(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_;
  std::thread thread_;
};

// The process's console writer (stdout and stderr, default options, drops reported as a
// warning of the "console" logger), created on first use and never destroyed; at exit it
// is finished with kDestroyTimeout. Thread-safe.
ConsoleWriter& console();

}  // namespace ddprun
