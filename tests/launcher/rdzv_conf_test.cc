// --rdzv_conf read as torch reads it (issue 45): split as _parse_rendezvous_config splits it,
// each key with the meaning the backend of that name gives it, a warning for a key without
// effect, and an error only where torch has one.
#include <catch2/catch.hpp>

#include "common/error.h"
#include "launcher/rdzv_conf.h"
#include "launcher/status_command.h"
#include "rendezvous/rounds/rendezvous_config.h"
#include "tests/launcher/parse_args.h"

using ddprun::UsageError;
using ddprun::launcher::rdzvConfForBackend;
using ddprun::launcher::splitRdzvConf;
using Conf = std::map<std::string, std::string>;
using namespace std::chrono_literals;

namespace {

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("rdzv_conf text splits as torch splits it", "[cli][rdzv_conf]") {
  CHECK(splitRdzvConf("").empty());
  CHECK(splitRdzvConf("   ").empty());
  CHECK(splitRdzvConf(" a = 1 , b=x=y ") == Conf{{"a", "1"}, {"b", "x=y"}});
  CHECK(splitRdzvConf("a=1,a=2") == Conf{{"a", "2"}});
  // The c10d tests' value, quote marks and all: keys and values are kept as typed.
  CHECK(splitRdzvConf("'join_timeout=5,last_call_timeout=1,timeout=5'") ==
        Conf{{"'join_timeout", "5"}, {"last_call_timeout", "1"}, {"timeout", "5'"}});
  CHECK(errorOf([] { splitRdzvConf("a=1,=2"); }) == "invalid --rdzv_conf value 'a=1,=2': entry '=2' is not key=value");
  CHECK(errorOf([] { splitRdzvConf("a=1,,b=2"); }) ==
        "invalid --rdzv_conf value 'a=1,,b=2': entry '' is not key=value");
  CHECK(errorOf([] { splitRdzvConf("a"); }) == "--rdzv_conf key 'a' has no value (expected key=value)");
  CHECK(errorOf([] { splitRdzvConf("a= ,b=1"); }) == "--rdzv_conf key 'a' has no value (expected key=value)");
  CHECK(errorOf([] { splitRdzvConf("a=1,\x1b[2J=1"); }).find('\x1b') == std::string::npos);
}

TEST_CASE("timeout bounds the join under static and etcd and does nothing under c10d and etcd-v2", "[cli][rdzv_conf]") {
  const Conf given{{"timeout", "5'"}};
  for (const char* backend : {"c10d", "etcd-v2"}) {
    auto c = rdzvConfForBackend(backend, given);
    CHECK(c.conf.empty());
    REQUIRE(c.warnings.size() == 1);
    CHECK(c.warnings[0] == "--rdzv_conf key 'timeout' has no effect with --rdzv_backend=" + std::string(backend) +
                               " (torch's " + backend + " rendezvous reads join_timeout, not timeout)");
  }
  for (const char* backend : {"static", "etcd"}) {
    auto c = rdzvConfForBackend(backend, {{"timeout", "5"}, {"join_timeout", "9"}});
    CHECK(c.conf == Conf{{"timeout", "5"}});  // the settings' name for join_timeout as torch's static reads it
    CHECK(c.warnings == std::vector<std::string>{"--rdzv_conf key 'join_timeout' has no effect with --rdzv_backend=" +
                                                 std::string(backend) + ": timeout is given"});
  }
}

TEST_CASE("the c10d tests' quoted rdzv_conf starts a job: only last_call_timeout takes effect", "[cli][rdzv_conf]") {
  auto p =
      ddprun::testing::parseArgs({"--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
                                  "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'", "--no_python", "true"});
  CHECK(p.config.rendezvous.conf == Conf{{"last_call_timeout", "1"}});
  auto s = ddprun::rendezvous::parseRendezvousSettings(p.config.rendezvous.conf);
  CHECK(s.join_timeout == 600s);
  CHECK(s.last_call_timeout == 1s);
}

TEST_CASE("each backend's keys with torch's names and spellings", "[cli][rdzv_conf]") {
  auto c10d = rdzvConfForBackend(
      "c10d", {{"is_host", "Y"}, {"read_timeout", "1_0"}, {"store_type", "tcp"}, {"protocol", "https"}, {"rank", "3"}});
  CHECK(c10d.conf == Conf{{"is_host", "true"}, {"read_timeout", "10"}, {"store_type", "tcp"}});
  CHECK(c10d.warnings == std::vector<std::string>{"--rdzv_conf key 'protocol' has no effect with --rdzv_backend=c10d",
                                                  "--rdzv_conf key 'rank' has no effect with --rdzv_backend=c10d"});
  CHECK(rdzvConfForBackend("c10d", {{"is_host", "F"}}).conf.at("is_host") == "false");
  CHECK(errorOf([] {
          rdzvConfForBackend("c10d", {{"is_host", "maybe"}});
        }) == "--rdzv_conf is_host=maybe: expected a boolean (1, true, t, yes, y or 0, false, f, no, n)");

  auto v2 = rdzvConfForBackend("etcd-v2", {{"ssl_cert", "c.pem"},
                                           {"ssl_cert_key", "k.pem"},
                                           {"ca_cert", "ca.pem"},
                                           {"cert", "other.pem"},
                                           {"is_host", "1"},
                                           {"key_prefix", "/jobs"}});
  CHECK(v2.conf == Conf{{"cert", "c.pem"}, {"key", "k.pem"}, {"cacert", "ca.pem"}, {"key_prefix", "/jobs"}});
  CHECK(v2.warnings ==
        std::vector<std::string>{"--rdzv_conf key 'cert' has no effect with --rdzv_backend=etcd-v2: ssl_cert is given",
                                 "--rdzv_conf key 'is_host' has no effect with --rdzv_backend=etcd-v2"});

  auto v1 = rdzvConfForBackend("etcd", {{"etcd_prefix", "/torchelastic/p2p"}, {"cert", "c.pem"}});
  CHECK(v1.conf == Conf{{"key_prefix", "/torchelastic/p2p"}, {"cert", "c.pem"}});
  CHECK(v1.warnings.empty());

  // torch's static rendezvous reads `rank` from --node_rank and ignores the c10d store's keys.
  auto st = rdzvConfForBackend("static", {{"rank", "1"}, {"store_type", "file"}, {"join_timeout", "7"}});
  CHECK(st.conf == Conf{{"join_timeout", "7"}});
  CHECK(st.warnings ==
        std::vector<std::string>{"--rdzv_conf key 'rank' has no effect with --rdzv_backend=static (--node_rank is the "
                                 "node's rank)",
                                 "--rdzv_conf key 'store_type' has no effect with --rdzv_backend=static"});
}

TEST_CASE("a value torch refuses for a key it reads is still refused", "[cli][rdzv_conf]") {
  using ddprun::testing::parseArgs;
  auto refused = [](std::vector<std::string> args) {
    args.insert(args.end(), {"--no_python", "true"});
    return errorOf([&] { parseArgs(args); });
  };
  CHECK_THAT(refused({"--standalone", "--rdzv_conf", "join_timeout=5'"}), Catch::Contains("join_timeout=5'"));
  CHECK_THAT(refused({"--rdzv_conf", "timeout=soon"}), Catch::Contains("timeout=soon"));
  CHECK(ddprun::rendezvous::parseRendezvousSettings(
            parseArgs({"--rdzv_conf=timeout=5", "--no_python", "true"}).config.rendezvous.conf)
            .join_timeout == 5s);
  CHECK_THAT(refused({"--standalone", "--rdzv_conf", "read_timeout=0"}), Catch::Contains("read_timeout=0"));
  CHECK_THAT(refused({"--rdzv_conf", "novalue"}), Catch::Contains("'novalue' has no value"));
}

TEST_CASE("status reads the job's rdzv_conf as the launcher does", "[cli][rdzv_conf][status]") {
  // The job's own value, quote marks and all: accepted (a warning for the keys c10d does not
  // read), so the only failure left is the store that is not there (port 1).
  const char* argv[] = {"ddprun", "status", "--rdzv_endpoint=127.0.0.1:1", "--rdzv_id=job",
                        "--rdzv_conf='join_timeout=5,last_call_timeout=1,timeout=5'"};
  CHECK_THROWS_AS(ddprun::launcher::runStatusCommand(5, argv), ddprun::RendezvousError);
  const char* empty_value[] = {"ddprun", "status", "--rdzv_endpoint=127.0.0.1:1", "--rdzv_id=job",
                               "--rdzv_conf=token_file="};
  CHECK(errorOf([&] { ddprun::launcher::runStatusCommand(5, empty_value); }) ==
        "status: --rdzv_conf key 'token_file' has no value (expected key=value)");
}
