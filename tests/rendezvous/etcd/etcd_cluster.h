// A real 3-member etcd cluster on loopback for a test (scripts/etcd-cluster): started in a
// temporary directory, stopped with nothing left behind when the object goes. The members
// listen on 127.0.0.1, .2 and .3 at etcd's own ports (2379, 2380): nothing is picked, so the
// test must run in a network namespace of its own (ctest runs etcd_tests under
// scripts/in-private-netns), where no one else holds them.
#pragma once

#include <string>

#include "tests/support/test_process.h"

namespace ddprun::testing {

class EtcdCluster {
 public:
  // Starts the members and waits until all are healthy. available() is false (and the
  // test should WARN with unavailableReason() and return: REQUIRE_ETCD) when etcd is not
  // installed, or when this process is not in the private network namespace that
  // scripts/in-private-netns made for it.
  explicit EtcdCluster(bool tls = false);
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  bool available() const { return available_; }
  const std::string& unavailableReason() const { return unavailable_reason_; }
  // "127.0.0.1:2379,127.0.0.2:2379,127.0.0.3:2379"
  const std::string& endpoints() const { return endpoints_; }
  std::string endpoint(int member) const;  // member 1..3
  // The member (1..3) that leads now; 0 when none does.
  int leader() const;
  int pid(int member) const;
  void kill(int member);
  void restart(int member);
  // Hands the leadership to `member` (etcdctl move-leader); true once it leads.
  bool makeLeader(int member);
  // Keys under `prefix` (etcdctl get --prefix --keys-only), one a line.
  std::string keys(const std::string& prefix) const;
  std::string tlsFile(const std::string& name) const { return dir_.path() + "/c/tls/" + name; }

 private:
  std::string script(const std::vector<std::string>& args) const;
  TempDir dir_;
  std::string cluster_;
  bool available_ = false;
  std::string unavailable_reason_;
  bool tls_ = false;
  std::string endpoints_;
};

}  // namespace ddprun::testing

// Skips the test (Catch2 2.13: WARN and return) when `cluster` could not start, naming why.
#define REQUIRE_ETCD(cluster)                                \
  if (!(cluster).available()) {                              \
    WARN((cluster).unavailableReason() << "; test skipped"); \
    return;                                                  \
  }
