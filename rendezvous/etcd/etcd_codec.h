// The pure parts of talking to etcd's v3 JSON gateway: base64 (keys and values travel as
// base64 in JSON), the range end of a prefix, endpoints and request/response bodies. No I/O,
// so every rule here is unit-tested (tests/rendezvous/etcd/etcd_codec_test.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ddprun::rendezvous::etcd {

std::string base64Encode(const std::string& bytes);
// Throws std::invalid_argument on a character outside the alphabet or a bad length.
std::string base64Decode(const std::string& text);

// etcd's "everything under this prefix" range end: the prefix with its last byte that is
// not 0xff incremented and the rest dropped ("\0" when there is none: the whole keyspace).
std::string prefixRangeEnd(const std::string& prefix);

// One member of --rdzv_endpoint: "host:port", "host" (port 2379) or "http(s)://host[:port]".
struct Endpoint {
  std::string host;
  int port = 2379;
  std::optional<bool> tls;  // from a scheme in the endpoint; unset: --rdzv_conf protocol
  std::string text() const { return host + ":" + std::to_string(port); }
};
// Splits a comma-separated member list. Throws UsageError naming the bad member.
std::vector<Endpoint> parseEndpoints(const std::string& list);

// A key and value as the gateway returns them (base64 already decoded).
struct KeyValue {
  std::string key;
  std::string value;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

// The gateway prints int64 fields as JSON strings ("revision": "12") and leaves out fields
// at their zero value: a missing field reads as 0.
int64_t int64Field(const nlohmann::json& object, const char* name);
std::vector<KeyValue> keyValues(const nlohmann::json& kvs);
// header.revision of a response.
int64_t headerRevision(const nlohmann::json& response);

// Request bodies.
nlohmann::json rangeRequest(const std::string& key, const std::string& range_end = "", bool keys_only = false);
nlohmann::json putRequest(const std::string& key, const std::string& value, int64_t lease = 0);
nlohmann::json deleteRequest(const std::string& key, const std::string& range_end = "");

// A watch stream carries one JSON message per line: {"result": {...}} or {"error": {...}}.
struct WatchEvent {
  bool deleted = false;  // DELETE (lease expiry included); otherwise PUT
  KeyValue kv;
};
struct WatchMessage {
  bool created = false;
  bool canceled = false;
  std::string error;  // an error message from the gateway or a cancel reason
  int64_t compact_revision = 0;
  int64_t revision = 0;  // header.revision
  std::vector<WatchEvent> events;
};
WatchMessage parseWatchMessage(const std::string& line);

}  // namespace ddprun::rendezvous::etcd
