// The pure parts of talking to etcd's v3 JSON gateway: base64 (keys and values travel as
// base64 in JSON), the range end of a prefix, endpoints and request/response bodies. No I/O,
// so every rule here is unit-tested (tests/rendezvous/etcd/etcd_codec_test.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "rendezvous/store/store.h"

namespace ddprun::rendezvous::etcd {

// A reply that etcd's gateway never sends: text that is not JSON, a field of the wrong type,
// a key or value that is not base64. Every reply is input: the decoders below throw this and
// nothing else, and EtcdHttp names the member and the call it came from (EtcdBadReply).
class EtcdDecodeError : public StoreError {
 public:
  using StoreError::StoreError;
};

// An error etcd reported in a reply that is otherwise well formed (its "error" field, as
// replyError() shows it); EtcdHttp names the member and the call (EtcdRequestError).
class EtcdReportedError : public StoreError {
 public:
  using StoreError::StoreError;
};

// How much of a text from etcd (a reply's body, an error message, a field) a message shows:
// etcd's own messages are far shorter, and a console line must stay one short line.
constexpr size_t kShownReplyBytes = 300;
// `text` made safe for one console line (ddprun::printable) and cut to kShownReplyBytes,
// with "... (N bytes)" after a cut.
std::string shownText(std::string_view text);

std::string base64Encode(const std::string& bytes);
// Throws EtcdDecodeError on a character outside the alphabet or a bad length.
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
// at their zero value: a missing (or null) field reads as 0, "" or false, and a missing
// `object` (null) as an empty one. A field of another type, or an `object` that is not one,
// throws EtcdDecodeError naming the field.
int64_t int64Field(const nlohmann::json& object, const char* name);
std::string stringField(const nlohmann::json& object, const char* name);
bool boolField(const nlohmann::json& object, const char* name);
// A field that holds an object or an array; missing: an empty one.
nlohmann::json objectField(const nlohmann::json& object, const char* name);
nlohmann::json arrayField(const nlohmann::json& object, const char* name);
// A reply's body (one line of a stream) as a JSON object.
nlohmann::json parseReply(const std::string& text);
// The key-values of a range reply's `kvs` (null: none).
std::vector<KeyValue> keyValues(const nlohmann::json& kvs);
// header.revision of a response.
int64_t headerRevision(const nlohmann::json& response);
// An `error` the gateway put in a reply (an object with a message, or a string), shown as
// shownText() does; empty when there is none.
std::string replyError(const nlohmann::json& reply);

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
  std::string error;  // an error message from the gateway or a cancel reason (as shownText())
  int64_t compact_revision = 0;
  int64_t revision = 0;  // header.revision
  std::vector<WatchEvent> events;
};
// Throws EtcdDecodeError (never another error) for a line that is not such a message.
WatchMessage parseWatchMessage(const std::string& line);

// One answer of /v3/lease/keepalive: {"result": {"ID", "TTL"}} or {"error": {...}}.
struct KeepAliveAnswer {
  int64_t ttl = 0;    // 0: the lease has expired
  std::string error;  // the gateway's error (as shownText())
};
// Throws EtcdDecodeError for a line that is not such an answer.
KeepAliveAnswer parseKeepAlive(const std::string& line);

}  // namespace ddprun::rendezvous::etcd
