#include "rendezvous/etcd/etcd_codec.h"

#include <charconv>
#include <limits>

#include <fmt/format.h>

#include "common/error.h"
#include "common/text_escape.h"

namespace ddprun::rendezvous::etcd {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int sextet(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool parsePort(const std::string& text, int& port) {
  const char* first = text.data();
  const char* last = first + text.size();
  const auto [end, ec] = std::from_chars(first, last, port);
  return ec == std::errc() && end == last && port >= 1 && port <= 65535;
}

// A field's value as a message shows it: its JSON text, escaped and cut.
std::string shownJson(const nlohmann::json& value) {
  return shownText(value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

// `name` of `object`, or nullptr when it is missing or null. Throws when `object` is neither
// an object nor null.
const nlohmann::json* fieldOf(const nlohmann::json& object, const char* name) {
  if (object.is_null()) return nullptr;
  if (!object.is_object()) {
    throw EtcdDecodeError(fmt::format("'{}' expected in an object, found {}", name, shownJson(object)));
  }
  const auto it = object.find(name);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

[[noreturn]] void wrongType(const char* name, const char* expected, const nlohmann::json& value) {
  throw EtcdDecodeError(fmt::format("field '{}' is not {} ({})", name, expected, shownJson(value)));
}

}  // namespace

std::string shownText(std::string_view text) { return printableCut(text, kShownReplyBytes); }

std::string base64Encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v =
        (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8) | uint8_t(bytes[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (rest == 2) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string base64Decode(const std::string& text) {
  if (text.size() % 4 != 0) {
    throw EtcdDecodeError(
        fmt::format("'{}' is not base64 (a length of {}, not a multiple of 4)", shownText(text), text.size()));
  }
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const int pad = last ? (text[i + 3] == '=') + (text[i + 2] == '=') : 0;
    if (pad == 1 && text[i + 2] == '=') throw EtcdDecodeError("'" + shownText(text) + "' is not base64 (padding)");
    uint32_t v = 0;
    for (int j = 0; j < 4 - pad; ++j) {
      const int s = sextet(text[i + j]);
      if (s < 0) throw EtcdDecodeError("'" + shownText(text) + "' is not base64 (a character outside it)");
      v |= uint32_t(s) << (18 - 6 * j);
    }
    out += char(v >> 16);
    if (pad < 2) out += char((v >> 8) & 0xff);
    if (pad < 1) out += char(v & 0xff);
  }
  return out;
}

std::string prefixRangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (uint8_t(end.back()) < 0xff) {
      end.back() = char(uint8_t(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

std::vector<Endpoint> parseEndpoints(const std::string& list) {
  std::vector<Endpoint> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = list.find(',', start);
    std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const std::string given = item;
    Endpoint e;
    for (const char* scheme : {"http://", "https://"}) {
      if (item.rfind(scheme, 0) == 0) {
        e.tls = std::string(scheme) == "https://";
        item = item.substr(std::string(scheme).size());
      }
    }
    if (!item.empty() && item.back() == '/') item.pop_back();
    std::string port;
    if (!item.empty() && item.front() == '[') {  // [v6]:port
      const size_t close = item.find(']');
      if (close == std::string::npos) throw UsageError("--rdzv_endpoint member '" + given + "': no closing ']'");
      e.host = item.substr(1, close - 1);
      if (close + 1 < item.size()) {
        if (item[close + 1] != ':') throw UsageError("--rdzv_endpoint member '" + given + "': expected ':' after ']'");
        port = item.substr(close + 2);
      }
    } else {
      const size_t colon = item.rfind(':');
      e.host = item.substr(0, colon);
      if (colon != std::string::npos) port = item.substr(colon + 1);
    }
    if (e.host.empty()) throw UsageError("--rdzv_endpoint member '" + given + "': no host (expected host:port)");
    if (!port.empty() || item.find(':') != std::string::npos) {
      if (!parsePort(port, e.port)) {
        throw UsageError("--rdzv_endpoint member '" + given + "': port '" + port + "' is not a number in 1..65535");
      }
    }
    out.push_back(e);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int64_t int64Field(const nlohmann::json& object, const char* name) {
  const nlohmann::json* v = fieldOf(object, name);
  if (!v) return 0;
  if (v->is_number_unsigned()) {
    if (v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) wrongType(name, "an int64", *v);
    return static_cast<int64_t>(v->get<uint64_t>());
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_string()) {
    const std::string& s = v->get_ref<const std::string&>();
    int64_t out = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec == std::errc() && end == s.data() + s.size()) return out;
  }
  wrongType(name, "an integer", *v);
}

std::string stringField(const nlohmann::json& object, const char* name) {
  const nlohmann::json* v = fieldOf(object, name);
  if (!v) return "";
  if (!v->is_string()) wrongType(name, "a string", *v);
  return v->get<std::string>();
}

bool boolField(const nlohmann::json& object, const char* name) {
  const nlohmann::json* v = fieldOf(object, name);
  if (!v) return false;
  if (!v->is_boolean()) wrongType(name, "a boolean", *v);
  return v->get<bool>();
}

nlohmann::json objectField(const nlohmann::json& object, const char* name) {
  const nlohmann::json* v = fieldOf(object, name);
  if (!v) return nlohmann::json::object();
  if (!v->is_object()) wrongType(name, "an object", *v);
  return *v;
}

nlohmann::json arrayField(const nlohmann::json& object, const char* name) {
  const nlohmann::json* v = fieldOf(object, name);
  if (!v) return nlohmann::json::array();
  if (!v->is_array()) wrongType(name, "an array", *v);
  return *v;
}

nlohmann::json parseReply(const std::string& text) {
  // Without exceptions: a parse error's message would quote the text unescaped.
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) throw EtcdDecodeError("text that is not JSON ('" + shownText(text) + "')");
  if (!j.is_object()) throw EtcdDecodeError("JSON that is not an object (" + shownJson(j) + ")");
  return j;
}

std::vector<KeyValue> keyValues(const nlohmann::json& kvs) {
  std::vector<KeyValue> out;
  if (kvs.is_null()) return out;
  if (!kvs.is_array()) wrongType("kvs", "an array", kvs);
  for (const auto& kv : kvs) {
    if (!kv.is_object()) wrongType("kvs", "an array of objects", kv);
    KeyValue v;
    v.key = base64Decode(stringField(kv, "key"));
    v.value = base64Decode(stringField(kv, "value"));
    v.mod_revision = int64Field(kv, "mod_revision");
    v.lease = int64Field(kv, "lease");
    out.push_back(std::move(v));
  }
  return out;
}

int64_t headerRevision(const nlohmann::json& response) {
  return int64Field(objectField(response, "header"), "revision");
}

std::string replyError(const nlohmann::json& reply) {
  const nlohmann::json* e = fieldOf(reply, "error");
  if (!e) return "";
  if (e->is_string()) return shownText(e->get_ref<const std::string&>());
  if (e->is_object()) {
    const nlohmann::json* message = fieldOf(*e, "message");
    if (message && message->is_string()) return shownText(message->get_ref<const std::string&>());
  }
  return shownJson(*e);
}

nlohmann::json rangeRequest(const std::string& key, const std::string& range_end, bool keys_only) {
  nlohmann::json r = {{"key", base64Encode(key)}};
  if (!range_end.empty()) r["range_end"] = base64Encode(range_end);
  if (keys_only) r["keys_only"] = true;
  return r;
}

nlohmann::json putRequest(const std::string& key, const std::string& value, int64_t lease) {
  nlohmann::json r = {{"key", base64Encode(key)}, {"value", base64Encode(value)}};
  if (lease != 0) r["lease"] = std::to_string(lease);
  return r;
}

nlohmann::json deleteRequest(const std::string& key, const std::string& range_end) {
  nlohmann::json r = {{"key", base64Encode(key)}};
  if (!range_end.empty()) r["range_end"] = base64Encode(range_end);
  return r;
}

WatchMessage parseWatchMessage(const std::string& line) {
  WatchMessage m;
  const nlohmann::json j = parseReply(line);
  m.error = replyError(j);
  if (!m.error.empty()) return m;
  const auto r = j.find("result");
  if (r == j.end() || !r->is_object()) {
    throw EtcdDecodeError("a watch message without a result object ('" + shownText(line) + "')");
  }
  m.created = boolField(*r, "created");
  m.canceled = boolField(*r, "canceled");
  if (m.canceled) {
    const std::string reason = stringField(*r, "cancel_reason");
    m.error = reason.empty() ? "the watch was canceled" : shownText(reason);
  }
  m.compact_revision = int64Field(*r, "compact_revision");
  m.revision = headerRevision(*r);
  for (const auto& ev : arrayField(*r, "events")) {
    if (!ev.is_object()) wrongType("events", "an array of objects", ev);
    WatchEvent w;
    const std::string type = stringField(ev, "type");
    if (type != "" && type != "PUT" && type != "DELETE") wrongType("type", "PUT or DELETE", ev["type"]);
    w.deleted = type == "DELETE";
    auto kv = keyValues(nlohmann::json::array({objectField(ev, "kv")}));
    w.kv = kv.front();
    m.events.push_back(std::move(w));
  }
  return m;
}

KeepAliveAnswer parseKeepAlive(const std::string& line) {
  KeepAliveAnswer a;
  const nlohmann::json j = parseReply(line);
  a.error = replyError(j);
  if (!a.error.empty()) return a;
  const auto r = j.find("result");
  if (r == j.end() || !r->is_object()) {
    throw EtcdDecodeError("a keep-alive answer without a result object ('" + shownText(line) + "')");
  }
  a.ttl = int64Field(*r, "TTL");
  if (a.ttl < 0) wrongType("TTL", "a TTL (0 or more)", (*r)["TTL"]);
  return a;
}

}  // namespace ddprun::rendezvous::etcd
