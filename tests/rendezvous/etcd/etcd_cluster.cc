#include "tests/rendezvous/etcd/etcd_cluster.h"

#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace ddprun::testing {

namespace {
std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Why this process may not bind etcd's fixed ports, or "" when it runs in the network namespace
// scripts/in-private-netns made for it (a name it left in the environment, checked against our
// own: a variable inherited into another namespace does not count).
std::string whyNoPrivateNetns() {
  if (const char* reason = std::getenv("DDPRUN_PRIVATE_NETNS_UNAVAILABLE")) return reason;
  const char* made = std::getenv("DDPRUN_PRIVATE_NETNS");
  char own[PATH_MAX] = {};
  const ssize_t n = ::readlink("/proc/self/ns/net", own, sizeof(own) - 1);
  if (made != nullptr && n > 0 && std::string(own, static_cast<size_t>(n)) == made) return "";
  return "not in a network namespace of its own (etcd's ports are fixed: run it under "
         "scripts/in-private-netns, as ctest does)";
}
}  // namespace

EtcdCluster::EtcdCluster(bool tls) : cluster_(dir_.path() + "/c"), tls_(tls) {
  unavailable_reason_ = whyNoPrivateNetns();
  if (!unavailable_reason_.empty()) return;
  std::vector<std::string> argv = {sourceDir() + "/scripts/etcd-cluster", "start", cluster_};
  if (tls) argv.push_back("--tls");
  const RunResult r = run(argv, {}, 60s);
  if (r.finished && r.exit_code == 77) {
    unavailable_reason_ = "etcd is not installed (scripts/setup)";
    return;
  }
  if (!r.finished || r.exit_code != 0) throw std::runtime_error("etcd-cluster start failed: " + r.err);
  endpoints_ = trim(r.out);
  available_ = true;
}

EtcdCluster::~EtcdCluster() {
  if (!available_) return;
  std::vector<int> pids;
  for (int member = 1; member <= 3; ++member) pids.push_back(pid(member));
  run({sourceDir() + "/scripts/etcd-cluster", "stop", cluster_}, {}, 30s);
  // The script stops every member; should one be left, it is ours to kill, not to leave.
  for (int p : pids) {
    if (p > 1 && processAlive(p)) {
      std::fprintf(stderr, "etcd member %d outlived etcd-cluster stop; killing it\n", p);
      ::kill(p, SIGKILL);
    }
  }
}

std::string EtcdCluster::script(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {sourceDir() + "/scripts/etcd-cluster"};
  argv.insert(argv.end(), args.begin(), args.end());
  const RunResult r = run(argv, {}, 30s);
  if (!r.finished) throw std::runtime_error("etcd-cluster " + args[0] + " timed out");
  return trim(r.out);
}

std::string EtcdCluster::endpoint(int member) const {
  size_t start = 0;
  for (int i = 1; i < member; ++i) start = endpoints_.find(',', start) + 1;
  return endpoints_.substr(start, endpoints_.find(',', start) - start);
}

int EtcdCluster::leader() const {
  const std::string out = script({"leader", cluster_});
  return out.empty() ? 0 : std::stoi(out);
}

int EtcdCluster::pid(int member) const { return std::stoi(script({"pid", cluster_, std::to_string(member)})); }

void EtcdCluster::kill(int member) { script({"kill", cluster_, std::to_string(member)}); }

void EtcdCluster::restart(int member) { script({"restart", cluster_, std::to_string(member)}); }

bool EtcdCluster::makeLeader(int member) {
  script({"make-leader", cluster_, std::to_string(member)});
  return leader() == member;
}

std::string EtcdCluster::keys(const std::string& prefix) const {
  std::vector<std::string> argv = {"/usr/bin/etcdctl", "--endpoints=" + endpoints_};
  if (tls_) {
    argv.insert(argv.end(), {"--cacert=" + tlsFile("ca.pem"), "--cert=" + tlsFile("client.pem"),
                             "--key=" + tlsFile("client-key.pem")});
  }
  argv.insert(argv.end(), {"get", "--prefix", "--keys-only", prefix});
  const RunResult r = run(argv, {{"ETCDCTL_API", "3"}}, 30s);
  return trim(r.out);
}

}  // namespace ddprun::testing
