#include "rendezvous/etcd/etcd_codec.h"

#include <charconv>
#include <stdexcept>

#include "common/error.h"

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

}  // namespace

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
  if (text.size() % 4 != 0) throw std::invalid_argument("base64 text of length " + std::to_string(text.size()));
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const int pad = last ? (text[i + 3] == '=') + (text[i + 2] == '=') : 0;
    if (pad == 1 && text[i + 2] == '=') throw std::invalid_argument("misplaced base64 padding");
    uint32_t v = 0;
    for (int j = 0; j < 4 - pad; ++j) {
      const int s = sextet(text[i + j]);
      if (s < 0) throw std::invalid_argument("a character outside base64");
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
  if (!object.is_object()) return 0;
  const auto it = object.find(name);
  if (it == object.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && end == s.data() + s.size()) return v;
  }
  throw std::invalid_argument(std::string("field '") + name + "' is not an integer");
}

std::vector<KeyValue> keyValues(const nlohmann::json& kvs) {
  std::vector<KeyValue> out;
  if (!kvs.is_array()) return out;
  for (const auto& kv : kvs) {
    KeyValue v;
    v.key = base64Decode(kv.value("key", ""));
    v.value = base64Decode(kv.value("value", ""));
    v.mod_revision = int64Field(kv, "mod_revision");
    v.lease = int64Field(kv, "lease");
    out.push_back(std::move(v));
  }
  return out;
}

int64_t headerRevision(const nlohmann::json& response) {
  const auto it = response.find("header");
  return it == response.end() ? 0 : int64Field(*it, "revision");
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
  const auto j = nlohmann::json::parse(line);
  if (auto e = j.find("error"); e != j.end()) {
    m.error = e->is_object() ? e->value("message", e->dump()) : e->dump();
    return m;
  }
  const auto r = j.find("result");
  if (r == j.end() || !r->is_object()) throw std::invalid_argument("a watch message without result");
  m.created = r->value("created", false);
  m.canceled = r->value("canceled", false);
  if (m.canceled) m.error = r->value("cancel_reason", "the watch was canceled");
  m.compact_revision = int64Field(*r, "compact_revision");
  m.revision = headerRevision(*r);
  if (auto events = r->find("events"); events != r->end() && events->is_array()) {
    for (const auto& ev : *events) {
      WatchEvent w;
      w.deleted = ev.value("type", "PUT") == "DELETE";
      auto kv = keyValues(nlohmann::json::array({ev.value("kv", nlohmann::json::object())}));
      if (!kv.empty()) w.kv = kv.front();
      m.events.push_back(std::move(w));
    }
  }
  return m;
}

}  // namespace ddprun::rendezvous::etcd
