#include "agent/hang/timers/timer_request.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>

#include <fmt/format.h>

namespace ddprun::agent {
namespace {

// One top-level value of the request object. Nested objects and arrays are read (so
// that the line is checked as JSON) but kept only as kOther: no field torch reads has one.
struct Value {
  enum class Kind { kString, kNumber, kBool, kNull, kOther };
  Kind kind = Kind::kNull;
  std::string text;       // kString
  double number = 0;      // kNumber
  bool integral = false;  // kNumber written without fraction or exponent, and fits int64
  int64_t integer = 0;
};

// A strict JSON reader for one object per line, plus the NaN and (-)Infinity that
// Python's json.dumps writes for such floats.
class Reader {
 public:
  explicit Reader(std::string_view text) : s_(text) {}

  bool readObject(std::map<std::string, Value>& out) {
    skipSpace();
    if (!consume('{')) return fail("expected '{'");
    skipSpace();
    if (consume('}')) return atEnd();
    for (;;) {
      skipSpace();
      std::string key;
      if (!readString(key)) return false;
      skipSpace();
      if (!consume(':')) return fail("expected ':'");
      Value value;
      if (!readValue(value, 1)) return false;
      out[key] = std::move(value);
      skipSpace();
      if (consume('}')) return atEnd();
      if (!consume(',')) return fail("expected ',' or '}'");
    }
  }

  const std::string& error() const { return error_; }

 private:
  static constexpr int kMaxDepth = 32;

  bool fail(std::string_view what) {
    if (error_.empty()) error_ = fmt::format("not JSON at byte {}: {}", i_, what);
    return false;
  }
  bool consume(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool consumeWord(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }
  void skipSpace() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r' || s_[i_] == '\n')) ++i_;
  }
  bool atEnd() {
    skipSpace();
    return i_ == s_.size() || fail("text after the object");
  }

  bool readValue(Value& v, int depth) {
    skipSpace();
    if (i_ >= s_.size()) return fail("expected a value");
    const char c = s_[i_];
    if (c == '"') {
      v.kind = Value::Kind::kString;
      return readString(v.text);
    }
    if (c == '{' || c == '[') {
      v.kind = Value::Kind::kOther;
      return skipNested(depth);
    }
    if (consumeWord("true") || consumeWord("false")) {
      v.kind = Value::Kind::kBool;
      return true;
    }
    if (consumeWord("null")) {
      v.kind = Value::Kind::kNull;
      return true;
    }
    v.kind = Value::Kind::kNumber;
    return readNumber(v);
  }

  bool skipNested(int depth) {
    if (depth > kMaxDepth) return fail("nested too deep");
    const char close = s_[i_] == '{' ? '}' : ']';
    ++i_;
    skipSpace();
    if (consume(close)) return true;
    for (;;) {
      skipSpace();
      Value ignored;
      if (close == '}') {
        std::string key;
        if (!readString(key)) return false;
        skipSpace();
        if (!consume(':')) return fail("expected ':'");
      }
      if (!readValue(ignored, depth + 1)) return false;
      skipSpace();
      if (consume(close)) return true;
      if (!consume(',')) return fail(close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
    }
  }

  bool readNumber(Value& v) {
    if (consumeWord("NaN")) {
      v.number = std::nan("");
      return true;
    }
    const bool negative = consume('-');
    if (consumeWord("Infinity")) {
      v.number = negative ? -HUGE_VAL : HUGE_VAL;
      return true;
    }
    const size_t start = negative ? i_ - 1 : i_;
    auto digits = [&] {
      const size_t from = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ - from;
    };
    const size_t int_start = i_;
    const size_t int_digits = digits();
    if (int_digits == 0) return fail("expected a value");
    if (int_digits > 1 && s_[int_start] == '0') return fail("leading zero");
    bool integral = true;
    if (consume('.')) {
      integral = false;
      if (digits() == 0) return fail("expected digits after '.'");
    }
    if (consume('e') || consume('E')) {
      integral = false;
      if (!consume('+')) consume('-');
      if (digits() == 0) return fail("expected digits in the exponent");
    }
    const std::string number(s_.substr(start, i_ - start));
    // The grammar above admits only what from_chars reads; a value out of double's range
    // reads as an infinity, as strtod gives it.
    const auto [number_end, number_ec] = std::from_chars(number.data(), number.data() + number.size(), v.number);
    if (number_ec == std::errc::result_out_of_range) v.number = number[0] == '-' ? -HUGE_VAL : HUGE_VAL;
    if (number_ec != std::errc() && number_ec != std::errc::result_out_of_range) return fail("not a number");
    if (integral) {
      auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), v.integer);
      v.integral = ec == std::errc() && end == number.data() + number.size();
    }
    return true;
  }

  static void appendUtf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  bool readHex4(uint32_t& out) {
    if (i_ + 4 > s_.size()) return fail("short \\u escape");
    out = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      out <<= 4;
      if (c >= '0' && c <= '9') {
        out |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        out |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        out |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return fail("bad \\u escape");
      }
    }
    return true;
  }

  // Python's json.dumps escapes every non-ASCII character (\uXXXX, surrogate pairs above
  // the BMP); raw UTF-8 passes through as it is.
  bool readString(std::string& out) {
    if (!consume('"')) return fail("expected a string");
    for (;;) {
      if (i_ >= s_.size()) return fail("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) return fail("unterminated string");
      const char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = 0;
          if (!readHex4(cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(i_, 2) == "\\u") {
            const size_t save = i_;
            i_ += 2;
            uint32_t low = 0;
            if (!readHex4(low)) return false;
            if (low >= 0xDC00 && low < 0xE000) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            } else {
              i_ = save;  // a lone high surrogate, then another escape
            }
          }
          appendUtf8(out, cp);
          break;
        }
        default: return fail("bad escape");
      }
    }
  }

  std::string_view s_;
  size_t i_ = 0;
  std::string error_;
};

const char* kindName(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::kString: return "a string";
    case Value::Kind::kNumber: return "a number";
    case Value::Kind::kBool: return "a boolean";
    case Value::Kind::kNull: return "null";
    case Value::Kind::kOther: return "an object or array";
  }
  return "?";
}

}  // namespace

ParsedTimerRequest parseTimerRequest(std::string_view line) {
  ParsedTimerRequest parsed;
  std::map<std::string, Value> fields;
  Reader reader(line);
  if (!reader.readObject(fields)) {
    parsed.error = reader.error();
    return parsed;
  }
  auto field = [&](const char* name, Value::Kind kind, bool integral) -> const Value* {
    auto it = fields.find(name);
    if (it == fields.end()) {
      parsed.error = fmt::format("no field '{}'", name);
      return nullptr;
    }
    const Value& v = it->second;
    if (v.kind != kind) {
      parsed.error =
          fmt::format("field '{}' is {}, not {}", name, kindName(v.kind), integral ? "an integer" : kindName(kind));
      return nullptr;
    }
    if (integral && !v.integral) {
      parsed.error = fmt::format("field '{}' is not an integer", name);
      return nullptr;
    }
    return &v;
  };
  const Value* pid = field("pid", Value::Kind::kNumber, true);
  if (!pid) return parsed;
  const Value* scope = field("scope_id", Value::Kind::kString, false);
  if (!scope) return parsed;
  const Value* expiration = field("expiration_time", Value::Kind::kNumber, false);
  if (!expiration) return parsed;
  const Value* signal = field("signal", Value::Kind::kNumber, true);
  if (!signal) return parsed;
  if (pid->integer <= 0 || pid->integer > INT32_MAX) {
    parsed.error = fmt::format("field 'pid' is {}, not a process id", pid->integer);
    return parsed;
  }
  if (std::isnan(expiration->number)) {
    parsed.error = "field 'expiration_time' is NaN";
    return parsed;
  }
  if (signal->integer > 64 || signal->integer < INT32_MIN) {
    parsed.error = fmt::format("field 'signal' is {}, not a signal number", signal->integer);
    return parsed;
  }
  TimerRequest request;
  if (auto v = fields.find("version"); v != fields.end() && v->second.integral) request.version = v->second.integer;
  request.pid = pid->integer;
  request.scope_id = scope->text;
  request.expiration_time = expiration->number;
  request.signal = static_cast<int>(signal->integer);
  parsed.request = std::move(request);
  return parsed;
}

std::vector<TimerLineBuffer::Line> TimerLineBuffer::feed(std::string_view data) {
  std::vector<Line> lines;
  while (!data.empty()) {
    const size_t newline = data.find('\n');
    const std::string_view piece = data.substr(0, newline);
    if (dropping_ > 0) {
      dropping_ += piece.size();
    } else if (held_.size() + piece.size() > kMaxLine) {
      dropping_ = held_.size() + piece.size();
      held_.clear();
    } else {
      held_.append(piece);
    }
    if (newline == std::string_view::npos) break;
    data.remove_prefix(newline + 1);
    if (dropping_ > 0) {
      lines.push_back(Line{{}, dropping_});
      dropping_ = 0;
    } else if (!held_.empty()) {
      lines.push_back(Line{std::move(held_), 0});
      held_.clear();
    }
  }
  return lines;
}

}  // namespace ddprun::agent
