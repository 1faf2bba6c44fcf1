// --rdzv_conf, read once for the launcher and `ddprun status`: the text split as torch's
// _parse_rendezvous_config splits it, then each key taken with the meaning torch's backend of
// that name gives it, in ddprun's own key names (rendezvous/rounds/rendezvous_config.h reads those).
// Keys the backend does not read have no effect: each gets one warning and is dropped, so a
// value torch never looks at (`timeout=5'` under c10d) cannot stop the job.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ddprun::launcher {

// "k1=v1,k2=v2": split on ',', each entry on its first '='; keys and values trimmed of spaces,
// the whole text too; a later key wins. As torch refuses them: an entry with an empty key, or a
// key without a value (no '=' or nothing after it), is a UsageError naming the entry.
std::map<std::string, std::string> splitRdzvConf(const std::string& text);

struct RdzvConf {
  std::map<std::string, std::string> conf;  // what takes effect, in ddprun's key names
  std::vector<std::string> warnings;        // one line per key without effect
};

// The keys of `parsed` that backend (static, c10d, etcd-v2, or etcd, torch's first etcd
// rendezvous) reads, with its meaning: `timeout` is the join's bound under static and etcd and
// nothing under c10d and etcd-v2; etcd-v2's ssl_cert, ssl_cert_key, ca_cert and etcd's
// etcd_prefix are cert, key, cacert and key_prefix; is_host takes torch's boolean spellings.
// ddprun's own keys (token_file, keep-alive and read timeouts...) apply wherever ddprun uses
// them. Values are checked later, by the rendezvous settings (rendezvous/rounds/rendezvous_config.h).
RdzvConf rdzvConfForBackend(const std::string& backend, const std::map<std::string, std::string>& parsed);

}  // namespace ddprun::launcher
