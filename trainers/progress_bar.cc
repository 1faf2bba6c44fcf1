#include "trainers/progress_bar.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "common/env_names.h"
#include "common/env_reader.h"

namespace ddprun::trainers {
namespace {

std::string formatDuration(double seconds) {
  const auto total = static_cast<long long>(seconds + 0.5);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", total / 3600, total / 60 % 60, total % 60);
  } else {
    std::snprintf(text, sizeof text, "%lld:%02lld", total / 60, total % 60);
  }
  return text;
}

}  // namespace

ProgressBar::ProgressBar(ProgressBarOptions options)
    : options_(options), start_(std::chrono::steady_clock::now()), last_draw_(start_) {
  options_.every = std::max<int64_t>(options_.every, 1);
}

bool ProgressBar::isTerminal(int fd) { return ::isatty(fd) == 1 && env::raw(env::kTerm) != "dumb"; }

std::string ProgressBar::render(int64_t step, double loss) const {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done_here = step - options_.first_step;
  const double steps_per_s = elapsed > 0 ? static_cast<double>(done_here) / elapsed : 0.0;
  const double samples_per_s = steps_per_s * static_cast<double>(options_.samples_per_step);
  const int64_t left = std::max<int64_t>(options_.total_steps - step, 0);
  const std::string eta = steps_per_s > 0 ? formatDuration(static_cast<double>(left) / steps_per_s) : "?";

  const double fraction = options_.total_steps > 0 ? static_cast<double>(step) / options_.total_steps : 1.0;
  constexpr int kWidth = 20;
  const int filled = std::clamp(static_cast<int>(fraction * kWidth), 0, kWidth);
  char text[256];
  std::snprintf(text, sizeof text, "step %lld/%lld [%s%s] %3d%% loss %.4f  %.0f samples/s  ETA %s",
                static_cast<long long>(step), static_cast<long long>(options_.total_steps),
                std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                static_cast<int>(fraction * 100), loss, samples_per_s, eta.c_str());
  return text;
}

void ProgressBar::update(int64_t step, double loss) {
  const bool last = step >= options_.total_steps;
  if (!options_.tty) {
    window_sum_ += loss;
    ++window_count_;
    if (step % options_.every != 0 && !last) return;
    std::fprintf(options_.out, "%s\n", render(step, window_sum_ / window_count_).c_str());
    std::fflush(options_.out);
    window_sum_ = 0.0;
    window_count_ = 0;
    return;
  }
  smoothed_ = has_smoothed_ ? 0.95 * smoothed_ + 0.05 * loss : loss;
  has_smoothed_ = true;
  const auto now = std::chrono::steady_clock::now();
  if (!last && drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  last_bar_ = render(step, smoothed_);
  std::fprintf(options_.out, "\r%s\x1b[K", last_bar_.c_str());
  std::fflush(options_.out);
  drawn_ = true;
}

void ProgressBar::message(const std::string& line) {
  if (options_.tty && drawn_) {
    std::fprintf(options_.out, "\r%s\x1b[K\n%s", line.c_str(), last_bar_.c_str());
  } else {
    std::fprintf(options_.out, "%s\n", line.c_str());
  }
  std::fflush(options_.out);
}

void ProgressBar::finish() {
  if (options_.tty && drawn_) {
    std::fprintf(options_.out, "\n");
    std::fflush(options_.out);
    drawn_ = false;
  }
}

}  // namespace ddprun::trainers
