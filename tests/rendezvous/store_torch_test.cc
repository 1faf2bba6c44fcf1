// Debian's torch 1.13 (/usr/bin/python3) against build/bin/ddprun_store_server: its
// TCPStore client (the torch 1.13 wire generation) for every operation it has, and a
// 2-process gloo job whose rendezvous runs through our server, as it will under ddprun
// with TORCHELASTIC_USE_AGENT_STORE=True. The Python scripts exit non-zero on any
// mismatch; keys are cross-checked from the C++ client, so both sides agree on bytes.
#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>

#include "rendezvous/store/tcp_store_client.h"
#include "tests/support/test_process.h"

using namespace ddprun::testing;
using ddprun::rendezvous::StoreClientOptions;
using ddprun::rendezvous::TcpStoreClient;

namespace {

const std::string kPython = "/usr/bin/python3";

// The standalone server on a kernel-chosen port; killed when the test ends.
class StoreServerProcess {
 public:
  explicit StoreServerProcess(const std::map<std::string, std::string>& env = {{"DDPRUN_TOKEN", ""}},
                              std::vector<std::string> extra = {})
      : process_(argv(std::move(extra)), env) {
    if (!process_.waitForOutput("listening on ", 10s)) {
      FAIL("ddprun_store_server did not start: " << process_.out() << process_.err());
    }
    auto at = process_.out().find("listening on ");
    port_ = std::stoi(process_.out().substr(at + 13));
  }
  int port() const { return port_; }
  TestProcess& process() { return process_; }

 private:
  static std::vector<std::string> argv(std::vector<std::string> extra) {
    std::vector<std::string> a = {binDir() + "/ddprun_store_server", "--host", "127.0.0.1", "--port", "0"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  TestProcess process_;
  int port_ = 0;
};

StoreClientOptions cxxClient(int port) {
  StoreClientOptions options;
  options.port = port;
  options.timeout = 10s;
  options.connect_timeout = 5s;
  return options;
}

std::string writeScript(const TempDir& dir, const std::string& name, const std::string& text) {
  std::string path = dir.file(name);
  std::ofstream(path) << text;
  return path;
}

const char* kStoreOpsScript = R"PY(
import sys, threading, time
from datetime import timedelta
import torch.distributed as dist

host, port = sys.argv[1], int(sys.argv[2])
failures = []

def expect(what, got, want):
    if got == want:
        print(f"ok: {what}", flush=True)
    else:
        failures.append(f"{what}: got {got!r}, want {want!r}")
        print(f"MISMATCH: {failures[-1]}", flush=True)

store = dist.TCPStore(host, port, 1, False, timedelta(seconds=30))
expect("num_keys counts the init/ key torch adds on joining", store.num_keys(), 1)
store.set("key", "value")
expect("set/get", store.get("key"), b"value")
store.set("bin", b"\x00\xff\x01")
expect("binary value", store.get("bin"), b"\x00\xff\x01")
expect("add", store.add("counter", 5), 5)
expect("add stored as decimal", store.get("counter"), b"5")
expect("add negative", store.add("counter", -7), -2)
expect("add result stored", store.get("counter"), b"-2")
expect("compare_set missing key, empty expected", store.compare_set("cs", "", "first"), b"first")
expect("compare_set created the key", store.get("cs"), b"first")
expect("compare_set match", store.compare_set("cs", "first", "second"), b"second")
expect("compare_set mismatch", store.compare_set("cs", "stale", "third"), b"second")
expect("compare_set missing key, expected given", store.compare_set("absent", "guess", "x"), b"guess")
expect("num_keys: init/, key, bin, counter, cs", store.num_keys(), 5)
expect("delete_key", store.delete_key("key"), True)
expect("delete_key of a deleted key", store.delete_key("key"), False)
expect("num_keys after delete", store.num_keys(), 4)

store.wait(["bin", "counter"])
store.wait(["bin"], timedelta(seconds=5))
print("ok: wait on present keys", flush=True)

# A wait released by another client's set.
other = dist.TCPStore(host, port, 1, False, timedelta(seconds=30))
def set_later():
    time.sleep(0.5)
    other.set("late", "arrived")
thread = threading.Thread(target=set_later)
start = time.monotonic()
thread.start()
store.wait(["late"], timedelta(seconds=20))
waited = time.monotonic() - start
thread.join()
expect("wait returned after the set", waited >= 0.4, True)
expect("value set by the other client", store.get("late"), b"arrived")

# A wait that times out, on its own client (torch 1.13 leaves that connection unusable).
waiter = dist.TCPStore(host, port, 1, False, timedelta(seconds=30))
start = time.monotonic()
try:
    waiter.wait(["never"], timedelta(milliseconds=700))
    failures.append("wait on a missing key returned")
except RuntimeError as e:
    elapsed = time.monotonic() - start
    print(f"wait timed out after {elapsed:.2f}s: {e}", flush=True)
    expect("wait timeout honoured", 0.6 <= elapsed < 10, True)
del waiter

# The server still serves everyone.
expect("store usable after another client's timeout", store.get("cs"), b"second")
store.set("from-torch", "hello from torch")
print("FAILURES" if failures else "ALL OK", flush=True)
sys.exit(1 if failures else 0)
)PY";

const char* kReadBackScript = R"PY(
import sys
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore(sys.argv[1], int(sys.argv[2]), None, False, timedelta(seconds=30))
value = store.get("from-ddprun")
print(f"read {value!r}", flush=True)
sys.exit(0 if value == b"bytes\x00from ddprun" else 1)
)PY";

const char* kAllReduceScript = R"PY(
import os, sys
from datetime import timedelta
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
want = world * (world + 1) / 2
ok = bool(torch.all(t == want))
dist.barrier()
print(f"rank {rank}/{world}: all_reduce sum {t.tolist()} {'ok' if ok else 'WRONG'}", flush=True)
dist.destroy_process_group()
sys.exit(0 if ok else 1)
)PY";

const char* kRefusedScript = R"PY(
import sys
from datetime import timedelta
import torch.distributed as dist
try:
    store = dist.TCPStore(sys.argv[1], int(sys.argv[2]), 1, False, timedelta(seconds=5))
    store.set("k", "v")
    print(f"got {store.get('k')!r}", flush=True)
except Exception as e:
    print(f"refused: {type(e).__name__}: {e}", flush=True)
    sys.exit(0)
print("CONNECTED to a store that requires a token", flush=True)
sys.exit(1)
)PY";

}  // namespace

TEST_CASE("torch 1.13's TCPStore client works against ddprun_store_server", "[torch]") {
  StoreServerProcess server;
  TempDir dir;
  auto script = writeScript(dir, "store_ops.py", kStoreOpsScript);
  auto r = run({kPython, script, "127.0.0.1", std::to_string(server.port())}, {}, 180s);
  INFO(r.out << r.err);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("ALL OK"));
  CHECK_THAT(r.out, Catch::Contains("wait timed out after"));

  // The same data seen from ddprun's client: torch prefixes keys with '/', but not 'init/'.
  TcpStoreClient cxx(cxxClient(server.port()));
  CHECK(cxx.get("/from-torch") == "hello from torch");
  CHECK(cxx.get("/counter") == "-2");
  CHECK(cxx.get("init/") == "3");  // three TCPStore(world_size=1) clients joined
  CHECK_FALSE(cxx.check({"/key"}));
  CHECK_FALSE(cxx.check({"/absent"}));
  // And what ddprun writes, torch reads.
  cxx.set("/from-ddprun", std::string("bytes\0from ddprun", 17));
  auto back =
      run({kPython, writeScript(dir, "read_back.py", kReadBackScript), "127.0.0.1", std::to_string(server.port())}, {},
          120s);
  INFO(back.out << back.err);
  REQUIRE(back.finished);
  CHECK(back.exit_code == 0);
}

TEST_CASE("a 2-process gloo all_reduce rendezvouses through ddprun_store_server", "[torch]") {
  StoreServerProcess server;
  TempDir dir;
  auto script = writeScript(dir, "all_reduce.py", kAllReduceScript);
  auto env = [&](int rank) {
    return std::map<std::string, std::string>{
        {"RANK", std::to_string(rank)},
        {"LOCAL_RANK", std::to_string(rank)},
        {"WORLD_SIZE", "2"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", std::to_string(server.port())},
        {"TORCHELASTIC_USE_AGENT_STORE", "True"},
        {"TORCHELASTIC_RESTART_COUNT", "0"},
        {"GLOO_SOCKET_IFNAME", "lo"},
        {"OMP_NUM_THREADS", "1"},
    };
  };
  TestProcess rank0({kPython, script}, env(0));
  TestProcess rank1({kPython, script}, env(1));
  bool done0 = rank0.wait(180s);
  bool done1 = rank1.wait(done0 ? 60s : 1s);
  INFO("rank 0:\n" << rank0.out() << rank0.err() << "\nrank 1:\n" << rank1.out() << rank1.err());
  REQUIRE(done0);
  REQUIRE(done1);
  CHECK(rank0.exitCode() == 0);
  CHECK(rank1.exitCode() == 0);
  CHECK_THAT(rank0.out(), Catch::Contains("rank 0/2: all_reduce sum [3.0, 3.0, 3.0, 3.0] ok"));
  CHECK_THAT(rank1.out(), Catch::Contains("rank 1/2: all_reduce sum [3.0, 3.0, 3.0, 3.0] ok"));
  // The rendezvous really ran through this server, under torch's agent-store prefix
  // (PrefixStore joins with '/', then TCPStore adds its own '/').
  TcpStoreClient cxx(cxxClient(server.port()));
  auto keys = cxx.listKeys();
  std::string listed;
  for (const auto& k : keys) listed += " " + k;
  INFO("keys on the server:" << listed);
  CHECK(std::any_of(keys.begin(), keys.end(),
                    [](const std::string& k) { return k.rfind("//worker/attempt_0/default_pg/", 0) == 0; }));
  CHECK(cxx.get("//worker/attempt_0/default_pg/store_based_barrier_key:1") == "2");  // both ranks counted
  CHECK(cxx.get("init/") == "2");
}

TEST_CASE("torch 1.13 cannot use a ddprun_store_server that requires a token", "[torch]") {
  TempDir dir;
  std::ofstream(dir.file("token")) << "s3cret\n";
  StoreServerProcess server({{"DDPRUN_TOKEN", ""}}, {"--token-file", dir.file("token")});
  auto script = writeScript(dir, "refused.py", kRefusedScript);
  auto r = run({kPython, script, "127.0.0.1", std::to_string(server.port())}, {}, 120s);
  INFO(r.out << r.err);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("refused"));
  CHECK(server.process().waitForOutput("torch 1.13 client cannot authenticate", 5s));
}
