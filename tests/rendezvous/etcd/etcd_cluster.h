// A real 3-member etcd cluster on loopback for a test (scripts/etcd-cluster): started in a
// temporary directory, stopped with nothing left behind when the object goes.
#pragma once

#include <string>

#include "tests/support/test_process.h"

namespace ddprun::testing {

class EtcdCluster {
 public:
  // Starts the members and waits until all are healthy. available() is false (and the
  // test should WARN and return) when etcd is not installed.
  explicit EtcdCluster(bool tls = false);
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  bool available() const { return available_; }
  // "127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"
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
  bool tls_ = false;
  std::string endpoints_;
};

}  // namespace ddprun::testing
