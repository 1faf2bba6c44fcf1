// The lines a layer's logger ("agent", "rendezvous"...) writes while a LogLines lives, for
// tests that wait for what another thread logs: waitFor() wakes on each line, so a test waits
// for the line itself rather than for a while in which it ought to have come.
#pragma once

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include "common/fmt_extern.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/logging.h"

namespace ddprun::testing {

class LogLines {
 public:
  explicit LogLines(std::string_view layer) : sink_(std::make_shared<Sink>()), log_(ddprun::logger(layer)) {
    saved_ = log_->sinks();
    log_->sinks() = {sink_};
  }
  ~LogLines() { log_->sinks() = saved_; }
  LogLines(const LogLines&) = delete;
  LogLines& operator=(const LogLines&) = delete;

  // Each line as "level: message" (e.g. "warning: ...").
  std::vector<std::string> lines() const {
    std::lock_guard lock(sink_->lines_mutex);
    return sink_->lines;
  }
  // Blocks until a line holding `text` has been logged (true), at most `guard` (false).
  bool waitFor(const std::string& text, std::chrono::milliseconds guard) const {
    std::unique_lock lock(sink_->lines_mutex);
    return sink_->logged.wait_for(lock, guard, [&] {
      for (const auto& line : sink_->lines) {
        if (line.find(text) != std::string::npos) return true;
      }
      return false;
    });
  }

 private:
  struct Sink final : spdlog::sinks::base_sink<std::mutex> {
    mutable std::mutex lines_mutex;
    std::condition_variable logged;
    std::vector<std::string> lines;  // guarded by lines_mutex

   protected:
    void sink_it_(const spdlog::details::log_msg& msg) override {
      std::string line = std::string(spdlog::level::to_string_view(msg.level).data(),
                                     spdlog::level::to_string_view(msg.level).size()) +
                         ": " + std::string(msg.payload.data(), msg.payload.size());
      {
        std::lock_guard lock(lines_mutex);
        lines.push_back(std::move(line));
      }
      logged.notify_all();
    }
    void flush_() override {}
  };

  std::shared_ptr<Sink> sink_;
  std::shared_ptr<spdlog::logger> log_;
  std::vector<spdlog::sink_ptr> saved_;
};

}  // namespace ddprun::testing
