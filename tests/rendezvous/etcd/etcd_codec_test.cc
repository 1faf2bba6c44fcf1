// The pure parts of the etcd backend: base64, prefix range ends, endpoints, the gateway's
// JSON (int64 as strings, fields left out at zero, watch messages) and --rdzv_conf.
#include <catch2/catch.hpp>

#include "common/error.h"
#include "rendezvous/etcd/etcd_backend.h"
#include "rendezvous/etcd/etcd_codec.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::etcd;

TEST_CASE("base64 matches RFC 4648's vectors and round-trips every byte", "[unit]") {
  CHECK(base64Encode("") == "");
  CHECK(base64Encode("f") == "Zg==");
  CHECK(base64Encode("fo") == "Zm8=");
  CHECK(base64Encode("foo") == "Zm9v");
  CHECK(base64Encode("foobar") == "Zm9vYmFy");
  CHECK(base64Decode("Zm9vYg==") == "foob");
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t n : {0, 1, 2, 3, 254, 255, 256}) CHECK(base64Decode(base64Encode(all.substr(0, n))) == all.substr(0, n));
}

TEST_CASE("base64 refuses text that is not base64", "[unit]") {
  CHECK_THROWS_AS(base64Decode("Zm9"), EtcdDecodeError);
  CHECK_THROWS_AS(base64Decode("Zm9*"), EtcdDecodeError);
  CHECK_THROWS_AS(base64Decode("Z=9v"), EtcdDecodeError);
  CHECK_THROWS_AS(base64Decode("Zg==Zm9v"), EtcdDecodeError);
}

TEST_CASE("a prefix's range end covers exactly the keys under it", "[unit]") {
  CHECK(prefixRangeEnd("/ddprun/") == "/ddprun0");
  CHECK(prefixRangeEnd(std::string("a\xff", 2)) == "b");
  CHECK(prefixRangeEnd(std::string("\xff\xff", 2)) == std::string(1, '\0'));
}

TEST_CASE("etcd endpoints: host:port lists, schemes, IPv6 and default port, bad members named", "[unit]") {
  const auto e = parseEndpoints("10.0.0.1:2379,https://etcd-b:12379,[::1]:4001,etcd-d");
  REQUIRE(e.size() == 4);
  CHECK(e[0].text() == "10.0.0.1:2379");
  CHECK_FALSE(e[0].tls.has_value());
  CHECK(e[1].host == "etcd-b");
  CHECK(e[1].port == 12379);
  CHECK(e[1].tls == true);
  CHECK(e[2].host == "::1");
  CHECK(e[2].port == 4001);
  CHECK(e[3].port == 2379);
  CHECK_THROWS_WITH(parseEndpoints("a:1,b:x"), Catch::Contains("'b:x'") && Catch::Contains("port 'x'"));
  CHECK_THROWS_WITH(parseEndpoints("a:1,,b:2"), Catch::Contains("no host"));
  CHECK_THROWS_WITH(parseEndpoints("a:70000"), Catch::Contains("1..65535"));
}

TEST_CASE("the gateway's JSON: int64 fields as strings, zero fields left out, keys and values in base64", "[unit]") {
  const auto reply = nlohmann::json::parse(
      R"({"header":{"revision":"42"},"kvs":[{"key":"Zm9v","value":"YmFy","mod_revision":"7","lease":"9"},
          {"key":"YQ=="}],"count":"2"})");
  CHECK(headerRevision(reply) == 42);
  CHECK(int64Field(reply, "count") == 2);
  CHECK(int64Field(reply, "missing") == 0);
  const auto kvs = keyValues(reply["kvs"]);
  REQUIRE(kvs.size() == 2);
  CHECK(kvs[0].key == "foo");
  CHECK(kvs[0].value == "bar");
  CHECK(kvs[0].mod_revision == 7);
  CHECK(kvs[0].lease == 9);
  CHECK(kvs[1].value.empty());
  CHECK(putRequest("k", "v", 5).dump() == R"({"key":"aw==","lease":"5","value":"dg=="})");
  CHECK(rangeRequest("a", "b", true).dump() == R"({"key":"YQ==","keys_only":true,"range_end":"Yg=="})");
}

TEST_CASE("watch messages: created, events (DELETE named, PUT left out), cancel and errors", "[unit]") {
  CHECK(parseWatchMessage(R"({"result":{"header":{"revision":"3"},"created":true}})").created);
  const auto m = parseWatchMessage(
      R"({"result":{"header":{"revision":"5"},"events":[{"kv":{"key":"YQ==","value":"MQ==","mod_revision":"4"}},
          {"type":"DELETE","kv":{"key":"Yg==","mod_revision":"5"}}]}})");
  CHECK(m.revision == 5);
  REQUIRE(m.events.size() == 2);
  CHECK_FALSE(m.events[0].deleted);
  CHECK(m.events[0].kv.value == "1");
  CHECK(m.events[1].deleted);
  CHECK(m.events[1].kv.key == "b");
  const auto c =
      parseWatchMessage(R"({"result":{"canceled":true,"compact_revision":"9","cancel_reason":"compacted"}})");
  CHECK(c.canceled);
  CHECK(c.compact_revision == 9);
  CHECK(c.error == "compacted");
  CHECK(parseWatchMessage(R"({"error":{"grpc_code":14,"message":"no leader"}})").error == "no leader");
}

TEST_CASE("etcd settings: protocol, key_prefix and TLS files checked, culprit named", "[unit]") {
  RendezvousConfig config;
  config.backend = "etcd-v2";
  config.endpoint = "127.0.0.1:2379,127.0.0.1:2380";
  const RendezvousSettings settings;
  auto s = parseEtcdSettings(config, settings);
  CHECK(s.key_prefix == "/ddprun");
  CHECK_FALSE(s.connection.tls);
  CHECK(s.connection.endpoints.size() == 2);
  config.conf = {{"protocol", "https"}, {"key_prefix", "/jobs/"}};
  s = parseEtcdSettings(config, settings);
  CHECK(s.connection.tls);
  CHECK(s.key_prefix == "/jobs");
  config.conf = {{"key_prefix", "jobs"}};
  CHECK_THROWS_WITH(parseEtcdSettings(config, settings), Catch::Contains("key_prefix=jobs"));
  config.conf = {{"protocol", "gopher"}};
  CHECK_THROWS_WITH(parseEtcdSettings(config, settings), Catch::Contains("protocol=gopher"));
  config.conf = {{"protocol", "https"}, {"cacert", "/nonexistent/ca.pem"}};
  CHECK_THROWS_WITH(EtcdBackend(config), Catch::Contains("cacert=/nonexistent/ca.pem"));
  config.conf = {{"cert", "/tmp/c.pem"}};
  CHECK_THROWS_WITH(EtcdBackend(config), Catch::Contains("cert and key go together"));
  config.endpoint.clear();
  config.conf.clear();
  CHECK_THROWS_AS(parseEtcdSettings(config, settings), ddprun::UsageError);
}

// Issue 44, defect 1: a reply is input. Each decoder throws EtcdDecodeError (a StoreError, so
// every caller handles it) and nothing else, whatever the JSON holds; what it quotes is escaped.
TEST_CASE("the decoders of etcd's replies throw EtcdDecodeError and nothing else on hostile JSON", "[unit]") {
  const std::vector<std::string> lines = {
      R"({"result":{"TTL":"abc"}})",
      R"({"result":{"TTL":1e300}})",
      R"({"result":{"TTL":18446744073709551615}})",
      R"({"result":{"TTL":-5}})",
      R"({"result":["TTL"]})",
      R"({"result":5})",
      R"({"error":{"message":17}})",
      R"([{"result":{}}])",
      R"("just a string")",
      "not json",
      "{\"result\":{\"events\":[{\"type\":\"DELETE\",\"kv\":{\"key\":\"!!!!\"}}]}}",
      R"({"result":{"events":[{"type":7}]}})",
      R"({"result":{"events":"all"}})",
      R"({"result":{"events":[5]}})",
      R"({"result":{"events":[{"kv":[]}]}})",
      R"({"result":{"events":[{"kv":{"key":"QQ==","mod_revision":"x"}}]}})",
      R"({"result":{"header":"x"}})",
      R"({"result":{"created":"yes"}})",
      R"({"result":{"canceled":true,"cancel_reason":["x"]}})",
      "{\"result\":{\"TTL\":\"\\u001b[31m\\n[ddprun] info: forged\"}}",
  };
  for (const auto& line : lines) {
    INFO(line);
    for (int which = 0; which < 2; ++which) {
      try {
        if (which == 0) {
          parseWatchMessage(line);
        } else {
          parseKeepAlive(line);
        }
      } catch (const EtcdDecodeError& e) {
        const std::string what = e.what();
        CHECK(what.find('\n') == std::string::npos);
        CHECK(what.find('\x1b') == std::string::npos);
      } catch (const std::exception& e) {
        FAIL("not an EtcdDecodeError: " << e.what());
      }
    }
  }
  CHECK_THROWS_WITH(int64Field(nlohmann::json::parse(R"({"ID":"abc"})"), "ID"),
                    Catch::Contains("field 'ID' is not an integer") && Catch::Contains("abc"));
  CHECK_THROWS_AS(keyValues(nlohmann::json::parse(R"("kvs")")), EtcdDecodeError);
  CHECK(parseKeepAlive(R"({"result":{"ID":"7","TTL":"5"}})").ttl == 5);
  CHECK(parseKeepAlive(R"({"result":{"ID":"7"}})").ttl == 0);
  CHECK(parseKeepAlive(R"({"error":{"grpc_code":5,"message":"requested lease not found"}})").error ==
        "requested lease not found");
}

TEST_CASE("text from etcd in a message is escaped and cut to a few hundred bytes saying how long it was", "[unit]") {
  CHECK(shownText("no leader") == "no leader");
  CHECK(shownText("a\x1b[2J\nb") == "a\\x1b[2J\\nb");
  const std::string long_text(1000, 'x');
  CHECK(shownText(long_text) == std::string(kShownReplyBytes, 'x') + "... (1000 bytes)");
}
