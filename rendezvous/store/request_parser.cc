#include "rendezvous/store/request_parser.h"

#include <cstring>

namespace ddprun::rendezvous {
namespace {

using wire::Command;

// Reads fields in order; remembers whether it ran out of bytes or hit a limit.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> data, const StoreLimits& limits) : data_(data), limits_(limits) {}

  bool ok() const { return !short_ && error_.empty(); }
  bool isShort() const { return short_; }
  const std::string& error() const { return error_; }
  size_t position() const { return pos_; }
  size_t needAtLeast() const { return need_; }

  template <class T>
  bool scalar(T& out) {
    if (!ok()) return false;
    if (data_.size() - pos_ < sizeof(T)) return ranShort(pos_ + sizeof(T));
    std::memcpy(&out, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }

  bool bytes(std::string& out, size_t limit, const char* what) {
    uint64_t length = 0;
    if (!scalar(length)) return false;
    if (length > limit)
      return fail(std::string(what) + " of " + std::to_string(length) + " bytes exceeds the limit of " +
                  std::to_string(limit));
    if (pos_ + length > limits_.max_request_bytes) return fail("request exceeds the size limit");
    if (data_.size() - pos_ < length) return ranShort(pos_ + length);
    out.assign(reinterpret_cast<const char*>(data_.data() + pos_), length);
    pos_ += length;
    return true;
  }

  bool key(std::string& out) { return bytes(out, limits_.max_key_bytes, "key"); }
  bool value(std::string& out) { return bytes(out, limits_.max_value_bytes, "value"); }

  bool count(uint64_t& out) {
    if (!scalar(out)) return false;
    if (out > limits_.max_keys_per_request) {
      return fail("request names " + std::to_string(out) + " keys, more than the limit of " +
                  std::to_string(limits_.max_keys_per_request));
    }
    return true;
  }

  bool fixed(std::string& out, size_t length) {
    if (!ok()) return false;
    if (data_.size() - pos_ < length) return ranShort(pos_ + length);
    out.assign(reinterpret_cast<const char*>(data_.data() + pos_), length);
    pos_ += length;
    return true;
  }

  bool fail(std::string why) {
    if (error_.empty()) error_ = std::move(why);
    return false;
  }

 private:
  bool ranShort(size_t need) {
    short_ = true;
    need_ = need;
    return false;
  }

  std::span<const uint8_t> data_;
  const StoreLimits& limits_;
  size_t pos_ = 0;
  size_t need_ = 0;
  bool short_ = false;
  std::string error_;
};

bool legacyToCurrent(uint8_t code, Request& out) {
  using wire::LegacyCommand;
  switch (static_cast<LegacyCommand>(code)) {
    case LegacyCommand::kSet: out.command = Command::kSet; return true;
    case LegacyCommand::kCompareSet: out.command = Command::kCompareSet; return true;
    case LegacyCommand::kGet: out.command = Command::kGet; return true;
    case LegacyCommand::kAdd: out.command = Command::kAdd; return true;
    case LegacyCommand::kCheck: out.command = Command::kCheck; return true;
    case LegacyCommand::kWait: out.command = Command::kWait; return true;
    case LegacyCommand::kGetNumKeys: out.command = Command::kGetNumKeys; return true;
    case LegacyCommand::kDeleteKey: out.command = Command::kDeleteKey; return true;
    case LegacyCommand::kWatchKey:
      out.command = Command::kGet;  // carries one key, like GET
      out.watch_key = true;
      return true;
  }
  return false;
}

void parseBody(Cursor& c, Request& r) {
  auto keyList = [&](bool with_values) {
    uint64_t n = 0;
    if (!c.count(n)) return;
    for (uint64_t i = 0; i < n && c.ok(); ++i) {
      r.keys.emplace_back();
      c.key(r.keys.back());
      if (with_values) {
        r.values.emplace_back();
        c.value(r.values.back());
      }
    }
  };
  auto oneKey = [&] {
    r.keys.emplace_back();
    return c.key(r.keys.back());
  };
  auto oneValue = [&] {
    r.values.emplace_back();
    return c.value(r.values.back());
  };
  if (r.watch_key) {
    oneKey();
    return;
  }
  switch (r.command) {
    case Command::kValidate:
    case Command::kPing: c.scalar(r.word); return;
    case Command::kSet:
    case Command::kAppend:
    case Command::kQueuePush:
      if (oneKey()) oneValue();
      return;
    case Command::kCompareSet:
      if (oneKey() && oneValue()) oneValue();
      return;
    case Command::kGet:
    case Command::kDeleteKey:
    case Command::kQueuePop:
    case Command::kQueueLen: oneKey(); return;
    case Command::kAdd:
    case Command::kBarrier:
      if (oneKey()) c.scalar(r.amount);
      return;
    case Command::kCheck:
    case Command::kWait:
    case Command::kMultiGet: keyList(false); return;
    case Command::kMultiSet: keyList(true); return;
    case Command::kGetNumKeys:
    case Command::kCancelWait:
    case Command::kListKeys: return;
    case Command::kAuthHello: c.fixed(r.blob, wire::kAuthNonceBytes); return;
    case Command::kAuthProof: c.fixed(r.blob, wire::kAuthMacBytes); return;
  }
}

bool knownCurrentCommand(uint8_t code) {
  return code <= static_cast<uint8_t>(Command::kBarrier) || code == static_cast<uint8_t>(Command::kAuthHello) ||
         code == static_cast<uint8_t>(Command::kAuthProof);
}

}  // namespace

wire::Generation detectGeneration(std::span<const uint8_t> first) {
  if (first.empty()) return wire::Generation::kUnknown;
  if (first[0] != static_cast<uint8_t>(Command::kValidate)) return wire::Generation::kLegacy;
  if (first.size() < 5) return wire::Generation::kUnknown;
  uint32_t magic = 0;
  std::memcpy(&magic, first.data() + 1, sizeof magic);
  // A legacy SET whose key length started with these bytes would be over a gigabyte.
  return magic == wire::kValidationMagic ? wire::Generation::kCurrent : wire::Generation::kLegacy;
}

ParseResult parseRequest(std::span<const uint8_t> data, wire::Generation generation, const StoreLimits& limits,
                         Request& out) {
  ParseResult result;
  out = Request{};
  if (data.empty()) {
    result.need_at_least = 1;
    return result;
  }
  const uint8_t code = data[0];
  if (generation == wire::Generation::kLegacy) {
    if (!legacyToCurrent(code, out)) {
      result.status = ParseStatus::kError;
      result.error = "unknown command " + std::to_string(code) + " (torch 1.13 protocol)";
      return result;
    }
  } else {
    if (!knownCurrentCommand(code)) {
      result.status = ParseStatus::kError;
      result.error = "unknown command " + std::to_string(code);
      return result;
    }
    out.command = static_cast<Command>(code);
  }
  Cursor cursor(data.subspan(1), limits);
  parseBody(cursor, out);
  if (!cursor.error().empty()) {
    result.status = ParseStatus::kError;
    result.error = cursor.error();
  } else if (cursor.isShort()) {
    result.status = ParseStatus::kNeedMore;
    result.need_at_least = 1 + cursor.needAtLeast();
  } else {
    result.status = ParseStatus::kComplete;
    result.consumed = 1 + cursor.position();
  }
  return result;
}

}  // namespace ddprun::rendezvous
