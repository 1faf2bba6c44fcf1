#include "rendezvous/rounds/rendezvous_config.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "common/durations.h"
#include "common/error.h"

namespace ddprun::rendezvous {
namespace {

// Lower bounds of rendezvous durations, in seconds (the upper one is kMaxDurationSeconds):
// no value may round to 0 ms, and intervals, which a loop sleeps between rounds of work, get
// a larger minimum so that a typo cannot make the loop spin a core.
constexpr double kMinSeconds = 0.001;
constexpr double kMinIntervalSeconds = 0.05;

std::chrono::milliseconds seconds(const std::string& key, const std::string& text, double min = kMinSeconds) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value) || value < min ||
      value > kMaxDurationSeconds) {
    throw UsageError(fmt::format("--rdzv_conf {}={}: expected a number of seconds from {} to {:.0f}", key, text, min,
                                 kMaxDurationSeconds));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(value * 1000 + 0.5));
}

bool boolean(const std::string& key, const std::string& text) {
  if (text == "1" || text == "true" || text == "True" || text == "yes") return true;
  if (text == "0" || text == "false" || text == "False" || text == "no") return false;
  throw UsageError("--rdzv_conf " + key + "=" + text + ": expected true or false");
}

// torch's c10d backend takes "tcp" (its default) or "file", trimmed and in any case.
void checkStoreType(const std::string& value) {
  std::string type;
  for (char c : value) type += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  type.erase(0, type.find_first_not_of(" \t"));
  type.erase(type.find_last_not_of(" \t") + 1);
  if (type == "tcp") return;
  if (type == "file") {
    throw UsageError("--rdzv_conf store_type=" + value +
                     ": ddprun's rendezvous uses a TCP store only; store_type=file is not supported");
  }
  throw UsageError("--rdzv_conf store_type=" + value + ": expected tcp (ddprun's rendezvous uses a TCP store only)");
}

}  // namespace

RendezvousSettings parseRendezvousSettings(const std::map<std::string, std::string>& conf) {
  RendezvousSettings s;
  for (const auto& [key, value] : conf) {
    if (key == "join_timeout" || key == "timeout") {
      s.join_timeout = seconds(key, value);
    } else if (key == "last_call_timeout") {
      s.last_call_timeout = seconds(key, value);
    } else if (key == "close_timeout") {
      s.close_timeout = seconds(key, value);
    } else if (key == "read_timeout") {
      s.read_timeout = seconds(key, value);
    } else if (key == "heartbeat_timeout") {
      s.heartbeat_timeout = seconds(key, value);
    } else if (key == "keep_alive_interval") {
      s.keep_alive_interval = seconds(key, value, kMinIntervalSeconds);
    } else if (key == "keep_alive_max_attempt") {
      char* end = nullptr;
      long n = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || n < 1 || n > 1000) {
        throw UsageError("--rdzv_conf keep_alive_max_attempt=" + value + ": expected an integer 1-1000");
      }
      s.keep_alive_max_attempt = static_cast<int>(n);
    } else if (key == "is_host") {
      s.is_host = boolean(key, value);
    } else if (key == "store_type") {
      checkStoreType(value);
    } else if (key == "token_file") {
      if (value.empty()) throw UsageError("--rdzv_conf token_file= needs a path");
      s.token_file = value;
    } else if (key == "protocol" || key == "cacert" || key == "cert" || key == "key" || key == "key_prefix") {
      // etcd's keys, read by rendezvous/etcd/etcd_backend.cc (parseEtcdSettings).
    } else {
      s.unknown_keys.push_back(key);
    }
  }
  return s;
}

}  // namespace ddprun::rendezvous
