// One named spdlog logger per layer. Only main() configures sinks and levels
// (configureLogging); libraries fetch their logger with logger("agent") etc.
// Levels come from DDPRUN_LOG_LEVEL in spdlog's syntax, e.g. "info,agent=debug".
#pragma once

#include <memory>
#include <string_view>

#include <spdlog/spdlog.h>

#include "common/fmt_extern.h"

namespace ddprun {

// Returns the logger for a layer, creating it (sharing the default sinks) on first use.
// Thread-safe.
std::shared_ptr<spdlog::logger> logger(std::string_view layer);

// Sends every layer's log lines to stderr with a "[ddprun] " style prefix and applies
// DDPRUN_LOG_LEVEL (default: info). Lines go through console() (common/console_writer.h):
// logging never blocks on a stalled stderr; when its queue is full, lines are dropped and
// counted. Call once, from main(), before any other thread starts.
void configureLogging(std::string_view program_name);

}  // namespace ddprun
