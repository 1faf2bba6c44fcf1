#include "common/logging.h"

#include <cstdlib>
#include <mutex>
#include <string>

#include <spdlog/cfg/helpers.h>
#include <spdlog/sinks/base_sink.h>

#include "common/console_writer.h"
#include "common/env_names.h"

namespace ddprun {
namespace {

// stderr through the console writer: a log line never waits for a stalled console.
class ConsoleSink : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    console().write(ConsoleStream::kStderr, std::string_view(formatted.data(), formatted.size()));
  }
  void flush_() override {}
};

std::mutex& registryMutex() {
  static std::mutex m;
  return m;
}

}  // namespace

std::shared_ptr<spdlog::logger> logger(std::string_view layer) {
  std::lock_guard lock(registryMutex());
  std::string name(layer);
  if (auto existing = spdlog::get(name)) return existing;
  auto created = spdlog::default_logger()->clone(name);
  // initialize_logger applies the DDPRUN_LOG_LEVEL entry for this name, if any.
  spdlog::initialize_logger(created);
  return created;
}

void configureLogging(std::string_view program_name) {
  auto sink = std::make_shared<ConsoleSink>();
  auto root = std::make_shared<spdlog::logger>(std::string(program_name), sink);
  spdlog::set_default_logger(root);
  spdlog::set_pattern("[ddprun] %^%l%$: %v");
  spdlog::set_level(spdlog::level::info);
  if (const char* levels = std::getenv(env::kLogLevel); levels && *levels) {
    spdlog::cfg::helpers::load_levels(levels);
  }
  // Its thread starts now, before main() starts (or forks) anything else.
  console();
}

}  // namespace ddprun
