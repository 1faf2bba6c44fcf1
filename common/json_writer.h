// A JSON object written field by field, for the one-line records ddprun emits (events,
// the health check's body, `ddprun status --json`, workers' error files). Writing only:
// ddprun never needs to parse JSON beyond the few fields `ddprun status` reads back from
// its own events file.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/text_escape.h"

namespace ddprun {

// `text` as a JSON string literal, quotes included: control characters escaped, valid
// UTF-8 passed through as it is, and each byte of an invalid UTF-8 sequence (a 0xFF in a
// run id, a worker's Latin-1 scope) written as U+FFFD, so that the line stays JSON.
inline std::string jsonString(std::string_view text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (static_cast<unsigned char>(c) >= 0x80) {
      const size_t length = utf8SequenceLength(text, i);
      if (length == 0) {
        out += "\\ufffd";
      } else {
        out.append(text.substr(i, length));
        i += length - 1;
      }
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

class JsonObject {
 public:
  JsonObject& add(std::string_view key, std::string_view value) { return raw(key, jsonString(value)); }
  JsonObject& add(std::string_view key, const char* value) { return raw(key, jsonString(value)); }
  JsonObject& add(std::string_view key, const std::string& value) { return raw(key, jsonString(value)); }
  JsonObject& add(std::string_view key, bool value) { return raw(key, value ? "true" : "false"); }
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  JsonObject& add(std::string_view key, T value) {
    return raw(key, std::to_string(value));
  }
  // Three decimals; a NaN or an infinity, which JSON cannot hold, as null.
  JsonObject& add(std::string_view key, double value) {
    if (!std::isfinite(value)) return addNull(key);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", value);
    return raw(key, buf);
  }
  JsonObject& add(std::string_view key, const JsonObject& value) { return raw(key, value.str()); }
  JsonObject& add(std::string_view key, const std::vector<JsonObject>& values) {
    std::string list = "[";
    for (size_t i = 0; i < values.size(); ++i) list += (i ? "," : "") + values[i].str();
    return raw(key, list + "]");
  }
  JsonObject& addNull(std::string_view key) { return raw(key, "null"); }
  // `json` must already be valid JSON.
  JsonObject& raw(std::string_view key, std::string_view json) {
    if (!body_.empty()) body_ += ",";
    body_ += jsonString(key);
    body_ += ":";
    body_ += json;
    return *this;
  }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

}  // namespace ddprun
