#include "launcher/rdzv_conf.h"

#include <algorithm>
#include <cctype>

#include "common/error.h"
#include "common/text_escape.h"

namespace ddprun::launcher {
namespace {

std::string trimmed(std::string_view text) {
  // Python's str.strip(): ASCII whitespace, as argparse hands torch the value.
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  return std::string(text);
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// A key as the backend reads it, and the name ddprun's settings know it by.
struct Key {
  const char* torch_name;
  const char* ddprun_name;
};

// Read by ddprun's rounds whatever the backend (torch's dynamic rendezvous reads the first six
// too; read_timeout is its store's; token_file is ddprun's own).
constexpr Key kRoundKeys[] = {{"join_timeout", "join_timeout"},
                              {"last_call_timeout", "last_call_timeout"},
                              {"close_timeout", "close_timeout"},
                              {"heartbeat_timeout", "heartbeat_timeout"},
                              {"keep_alive_interval", "keep_alive_interval"},
                              {"keep_alive_max_attempt", "keep_alive_max_attempt"},
                              {"read_timeout", "read_timeout"},
                              {"token_file", "token_file"}};
// c10d's TCP store: who hosts it, and its type (tcp only; rendezvous_config.cc refuses file).
constexpr Key kC10dKeys[] = {{"is_host", "is_host"}, {"store_type", "store_type"}};
// torch's static rendezvous reads `timeout`: how long its store waits for the other nodes.
constexpr Key kStaticKeys[] = {{"timeout", "join_timeout"}};
// ddprun's etcd keys (rendezvous/etcd/etcd_backend.cc), which torch's first etcd rendezvous shares.
constexpr Key kEtcdKeys[] = {
    {"protocol", "protocol"}, {"cacert", "cacert"}, {"cert", "cert"}, {"key", "key"}, {"key_prefix", "key_prefix"}};
// torch's etcd-v2 backend names the TLS files so.
constexpr Key kEtcdV2Names[] = {{"ssl_cert", "cert"}, {"ssl_cert_key", "key"}, {"ca_cert", "cacert"}};
// torch's first etcd rendezvous: `timeout` bounds the whole rendezvous, as join_timeout does.
constexpr Key kEtcdV1Names[] = {{"timeout", "join_timeout"}, {"etcd_prefix", "key_prefix"}};

template <size_t N>
void add(std::vector<Key>& keys, const Key (&more)[N]) {
  keys.insert(keys.end(), more, more + N);
}

std::vector<Key> keysOf(const std::string& backend) {
  std::vector<Key> keys;
  add(keys, kRoundKeys);
  if (backend == "c10d") add(keys, kC10dKeys);
  if (backend == "static") add(keys, kStaticKeys);
  if (backend == "etcd-v2" || backend == "etcd") add(keys, kEtcdKeys);
  if (backend == "etcd-v2") add(keys, kEtcdV2Names);
  if (backend == "etcd") add(keys, kEtcdV1Names);
  return keys;
}

// torch's get_as_bool spellings, any case; ddprun's settings take true and false.
std::string torchBoolean(const std::string& key, const std::string& value) {
  const std::string v = lower(value);
  if (v == "1" || v == "true" || v == "t" || v == "yes" || v == "y") return "true";
  if (v == "0" || v == "false" || v == "f" || v == "no" || v == "n") return "false";
  throw UsageError("--rdzv_conf " + key + "=" + printable(value) +
                   ": expected a boolean (1, true, t, yes, y or 0, false, f, no, n)");
}

// Python's int() takes "1_000"; the settings read the digits.
std::string withoutDigitGroups(const std::string& value) {
  std::string out;
  for (size_t i = 0; i < value.size(); ++i) {
    const bool between_digits = value[i] == '_' && i > 0 && i + 1 < value.size() &&
                                std::isdigit(static_cast<unsigned char>(value[i - 1])) &&
                                std::isdigit(static_cast<unsigned char>(value[i + 1]));
    if (!between_digits) out += value[i];
  }
  return out;
}

}  // namespace

std::map<std::string, std::string> splitRdzvConf(const std::string& text) {
  std::map<std::string, std::string> conf;
  const std::string all = trimmed(text);
  if (all.empty()) return conf;
  std::string_view rest(all);
  while (true) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const auto eq = item.find('=');
    const std::string key = trimmed(item.substr(0, eq));
    if (key.empty()) {
      throw UsageError("invalid --rdzv_conf value '" + printable(text) + "': entry '" + printable(std::string(item)) +
                       "' is not key=value");
    }
    const std::string value = eq == std::string_view::npos ? "" : trimmed(item.substr(eq + 1));
    if (value.empty()) throw UsageError("--rdzv_conf key '" + printable(key) + "' has no value (expected key=value)");
    conf[key] = value;
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return conf;
}

RdzvConf rdzvConfForBackend(const std::string& backend, const std::map<std::string, std::string>& parsed) {
  const std::vector<Key> keys = keysOf(backend);
  RdzvConf out;
  // Where torch's name and ddprun's both name one setting, torch's wins (it is what torchrun
  // would have read); the other is the one without effect.
  std::map<std::string, std::string> source_of;  // ddprun name -> the key it came from
  for (const Key& key : keys) {
    const auto given = parsed.find(key.torch_name);
    if (given == parsed.end()) continue;
    const std::string name = key.ddprun_name;
    const bool renamed = name != key.torch_name;
    if (source_of.count(name) && !renamed) continue;  // a torch name set it already
    std::string value = given->second;
    if (name == "is_host") value = torchBoolean(key.torch_name, value);
    if (name.find("timeout") != std::string::npos || name == "keep_alive_interval" ||
        name == "keep_alive_max_attempt") {
      value = withoutDigitGroups(value);
    }
    out.conf[name] = value;
    source_of[name] = key.torch_name;
  }
  // ddprun's settings read `timeout` as join_timeout too, and name it in their errors as typed.
  if (const auto from = source_of.find("join_timeout"); from != source_of.end() && from->second == "timeout") {
    out.conf["timeout"] = out.conf.at("join_timeout");
    out.conf.erase("join_timeout");
  }
  for (const auto& [key, value] : parsed) {
    const bool read = std::any_of(keys.begin(), keys.end(), [&](const Key& k) {
      return k.torch_name == key && source_of.count(k.ddprun_name) && source_of.at(k.ddprun_name) == key;
    });
    if (read) continue;
    std::string why;
    for (const Key& k : keys) {
      if (k.torch_name == key && source_of.count(k.ddprun_name)) why = ": " + source_of.at(k.ddprun_name) + " is given";
    }
    if (why.empty() && key == "timeout") why = " (torch's " + backend + " rendezvous reads join_timeout, not timeout)";
    if (why.empty() && key == "rank" && backend == "static") why = " (--node_rank is the node's rank)";
    out.warnings.push_back("--rdzv_conf key '" + printable(key) + "' has no effect with --rdzv_backend=" + backend +
                           why);
  }
  return out;
}

}  // namespace ddprun::launcher
