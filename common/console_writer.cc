#include "common/console_writer.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <utility>

#include "common/logging.h"

namespace ddprun {
namespace {

using ConsoleClock = std::chrono::steady_clock;

struct Item {
  ConsoleStream stream;
  std::string text;
};

uint64_t linesIn(std::string_view text) {
  return std::max<uint64_t>(1, static_cast<uint64_t>(std::count(text.begin(), text.end(), '\n')));
}

// Blocking, as the console's other writers (the workers) expect; only the writer thread
// ever waits on it.
void writeAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // EPIPE, EBADF: nobody is there to read it.
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

// Shared by the object and its thread, so that a thread the destructor left stuck in a
// write still has what it uses.
struct ConsoleWriter::State {
  explicit State(Options o) : options(std::move(o)) {}

  const Options options;
  mutable std::mutex mutex;
  std::condition_variable work;     // something to write or report, or stop
  std::condition_variable written;  // written_count moved on
  std::deque<Item> queue;
  size_t queued_bytes = 0;     // including the item being written
  uint64_t enqueued = 0;       // items accepted so far
  uint64_t written_count = 0;  // items written (or given up on) so far
  uint64_t dropped_total = 0;
  uint64_t unreported = 0;
  ConsoleClock::time_point next_report{};
  bool finished = false;  // no more drop reports
  bool stop = false;
};

ConsoleWriter::ConsoleWriter(Options options) : state_(std::make_shared<State>(std::move(options))) {
  thread_ = std::thread(run, state_);
}

ConsoleWriter::~ConsoleWriter() {
  const bool idle = finish(kDestroyTimeout);
  {
    std::lock_guard lock(state_->mutex);
    state_->stop = true;
  }
  state_->work.notify_all();
  if (idle) {
    thread_.join();
  } else {
    thread_.detach();
  }
}

bool ConsoleWriter::write(ConsoleStream stream, std::string_view text) {
  if (text.empty()) return true;
  {
    std::lock_guard lock(state_->mutex);
    if (state_->queued_bytes + text.size() > state_->options.capacity) {
      const uint64_t lines = linesIn(text);
      state_->dropped_total += lines;
      state_->unreported += lines;
      return false;
    }
    state_->queue.push_back(Item{stream, std::string(text)});
    state_->queued_bytes += text.size();
    ++state_->enqueued;
  }
  state_->work.notify_one();
  return true;
}

bool ConsoleWriter::flush(std::chrono::milliseconds timeout) {
  std::unique_lock lock(state_->mutex);
  const uint64_t target = state_->enqueued;
  return state_->written.wait_for(lock, timeout, [&] { return state_->written_count >= target; });
}

bool ConsoleWriter::finish(std::chrono::milliseconds timeout) {
  uint64_t unreported = 0;
  {
    std::lock_guard lock(state_->mutex);
    if (!state_->finished) unreported = std::exchange(state_->unreported, 0);
    state_->finished = true;
  }
  if (unreported > 0 && state_->options.on_dropped) state_->options.on_dropped(unreported);
  return flush(timeout);
}

uint64_t ConsoleWriter::droppedLines() const {
  std::lock_guard lock(state_->mutex);
  return state_->dropped_total;
}

void ConsoleWriter::run(const std::shared_ptr<State>& state) {
  // Signals are the event loop's business; none should land in (and interrupt) this thread.
  sigset_t all;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, nullptr);

  std::unique_lock lock(state->mutex);
  for (;;) {
    const bool report_pending = state->unreported > 0 && !state->finished && state->options.on_dropped;
    // Drops are reported when this thread is free again, i.e. once the console moves, so
    // that the report can be read.
    if (report_pending && ConsoleClock::now() >= state->next_report) {
      const uint64_t count = std::exchange(state->unreported, 0);
      state->next_report = ConsoleClock::now() + state->options.report_interval;
      lock.unlock();
      state->options.on_dropped(count);
      lock.lock();
      continue;
    }
    if (state->queue.empty()) {
      if (state->stop) return;
      if (report_pending) {
        state->work.wait_until(lock, state->next_report);
      } else {
        state->work.wait(lock);
      }
      continue;
    }
    Item item = std::move(state->queue.front());
    state->queue.pop_front();
    lock.unlock();
    writeAll(item.stream == ConsoleStream::kStdout ? state->options.stdout_fd : state->options.stderr_fd, item.text);
    lock.lock();
    state->queued_bytes -= item.text.size();
    ++state->written_count;
    state->written.notify_all();
  }
}

ConsoleWriter& console() {
  static ConsoleWriter* const instance = [] {
    ConsoleWriter::Options options;
    options.on_dropped = [](uint64_t dropped) {
      logger("console")->warn("console stalled: dropped {} line{} of output (log files are not affected)", dropped,
                              dropped == 1 ? "" : "s");
    };
    auto* created = new ConsoleWriter(std::move(options));
    // What is still queued gets a bounded chance to reach the console at exit.
    std::atexit([] { console().finish(ConsoleWriter::kDestroyTimeout); });
    return created;
  }();
  return *instance;
}

}  // namespace ddprun
