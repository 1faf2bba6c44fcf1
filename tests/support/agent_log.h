// The "agent" logger's lines ("<level>: <text>" each), captured while an AgentLog lives, for
// the tests of the agent and of its parts that read what it says; header-only, so a part's
// test binary needs no more than common's logging. At debug level unless told to leave the
// logger's level as it is; the sinks and level are put back at the end.
#pragma once

#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "common/fmt_extern.h"

#include "common/logging.h"

namespace ddprun::testing {

class AgentLog {
 public:
  // The logger's level while it lives: every line (debug), or none to leave it as it is.
  static constexpr std::optional<spdlog::level::level_enum> kOwnLevel = std::nullopt;

  explicit AgentLog(std::optional<spdlog::level::level_enum> level = spdlog::level::debug)
      : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(text_)), log_(ddprun::logger("agent")) {
    sink_->set_pattern("%l: %v");
    saved_ = log_->sinks();
    log_->sinks() = {sink_};
    level_ = log_->level();
    if (level) log_->set_level(*level);
  }
  ~AgentLog() {
    log_->sinks() = saved_;
    log_->set_level(level_);
  }
  AgentLog(const AgentLog&) = delete;
  AgentLog& operator=(const AgentLog&) = delete;

  std::string text() const { return text_.str(); }
  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    std::istringstream in(text_.str());
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }
  // How many lines hold `part`.
  size_t count(const std::string& part) const {
    size_t n = 0;
    for (const std::string& line : lines()) n += line.find(part) != std::string::npos;
    return n;
  }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> log_;
  std::vector<spdlog::sink_ptr> saved_;
  spdlog::level::level_enum level_;
};

}  // namespace ddprun::testing
