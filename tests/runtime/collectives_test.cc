// The collectives of ddprun::dist, end to end: ddprun_collectives_worker checks every
// operation against results it computes on its own and reports by exit status, so these
// tests only choose the matrix (ops x reduce ops x dtypes x sizes x world sizes), start
// the workers (through ddprun, or directly for tcp:// and file:// init) and read the exits.
// Both the sizes 0, 1, 7 and 1000003 (a prime: no world size divides it) run the whole
// matrix at world sizes 1, 2, 3, 4 and 8; rooted collectives at 1000003 elements use every
// root at world sizes 2 and 3, one rotating root elsewhere.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

std::string workerPath() { return binDir() + "/ddprun_collectives_worker"; }

std::string tail(const std::string& text, size_t bytes = 4000) {
  return text.size() <= bytes ? text : "..." + text.substr(text.size() - bytes);
}

std::string big() { return "1000003"; }

// Runs the worker under ddprun with `nproc` workers.
RunResult runWorkers(int nproc, const std::vector<std::string>& args, std::chrono::seconds timeout = 240s,
                     const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> argv = {ddprunPath(),       "--standalone", "--nproc_per_node=" + std::to_string(nproc),
                                   "--term_timeout=5", "--no_python",  workerPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, env, timeout);
}

void requireAllOk(const RunResult& r, int nproc) {
  INFO("stdout:\n" << tail(r.out));
  INFO("stderr:\n" << tail(r.err));
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(countOf(r.out, "collectives ok") == nproc);
  CHECK(countOf(r.err, "MISMATCH") == 0);
}

// Starts `world` workers directly (no ddprun) with the given init method.
std::vector<std::unique_ptr<TestProcess>> startDirect(const std::string& init, int world,
                                                      const std::vector<std::string>& args,
                                                      std::map<std::string, std::string> env = {}) {
  // No launcher contract in the environment: the init method alone must do.
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) env[name] = "";
  env["OMP_NUM_THREADS"] = "1";
  std::vector<std::unique_ptr<TestProcess>> procs;
  for (int rank = 0; rank < world; ++rank) {
    std::vector<std::string> argv = {
        workerPath(), "--init", init, "--rank", std::to_string(rank), "--world-size", std::to_string(world)};
    argv.insert(argv.end(), args.begin(), args.end());
    procs.push_back(std::make_unique<TestProcess>(argv, env));
  }
  return procs;
}

// Waits for every process until one shared deadline; returns whether all exited.
bool waitAll(std::vector<std::unique_ptr<TestProcess>>& procs, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool all = true;
  for (auto& p : procs) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    all = p->wait(std::max(left, std::chrono::milliseconds(1))) && all;
  }
  return all;
}

void requireDirectOk(std::vector<std::unique_ptr<TestProcess>>& procs, std::chrono::seconds timeout) {
  const bool exited = waitAll(procs, timeout);
  for (size_t rank = 0; rank < procs.size(); ++rank) {
    INFO("rank " << rank << " stdout:\n" << tail(procs[rank]->out()));
    INFO("rank " << rank << " stderr:\n" << tail(procs[rank]->err()));
    REQUIRE(exited);
    CHECK(procs[rank]->exitCode() == 0);
    CHECK(countOf(procs[rank]->out(), "collectives ok") == 1);
  }
}

// Worker processes (not ddprun) whose command line holds `marker`.
std::vector<pid_t> workersWith(const std::string& marker) {
  std::vector<pid_t> pids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = readFile(entry.path().string() + "/cmdline");
    for (auto& ch : cmdline) {
      if (ch == '\0') ch = ' ';
    }
    if (cmdline.find("ddprun_collectives_worker") != std::string::npos && cmdline.find(marker) != std::string::npos &&
        processAlive(std::stoi(name))) {
      pids.push_back(std::stoi(name));
    }
  }
  return pids;
}

const std::vector<std::string> kSmall = {"--sizes", "0,1,7"};

}  // namespace

// ---- the whole matrix at sizes 0, 1 and 7, every world size ----

TEST_CASE("every collective x reduce op x dtype at sizes 0 1 7 with world size 1", "[e2e][collectives]") {
  requireAllOk(runWorkers(1, kSmall), 1);
}

TEST_CASE("every collective x reduce op x dtype at sizes 0 1 7 with world size 2", "[e2e][collectives]") {
  requireAllOk(runWorkers(2, kSmall), 2);
}

TEST_CASE("every collective x reduce op x dtype at sizes 0 1 7 with world size 3", "[e2e][collectives]") {
  requireAllOk(runWorkers(3, kSmall), 3);
}

TEST_CASE("every collective x reduce op x dtype at sizes 0 1 7 with world size 4", "[e2e][collectives]") {
  requireAllOk(runWorkers(4, kSmall), 4);
}

TEST_CASE("every collective x reduce op x dtype at sizes 0 1 7 with world size 8", "[e2e][collectives]") {
  requireAllOk(runWorkers(8, kSmall), 8);
}

TEST_CASE("every collective blocking only and async only at world size 3", "[e2e][collectives]") {
  for (const char* mode : {"never", "always"}) {
    INFO("--async " << mode);
    requireAllOk(runWorkers(3, {"--sizes", "0,1,7", "--async", mode}), 3);
  }
}

// A strided tensor goes through a contiguous copy; every op queued behind an async SUM of it
// must copy in the SUM's result (the host-copy ordering bug first seen on a GPU). The worker's
// async section checks all_reduce, broadcast, reduce, all_gather, gather, reduce_scatter and
// scatter so, on shared memory and on TCP.
TEST_CASE("an op reads what the async op issued before it on the group wrote back, through host copies",
          "[e2e][collectives]") {
  requireAllOk(runWorkers(2, {"--ops", "async", "--sizes", "1,7,4099"}), 2);
  requireAllOk(runWorkers(3, {"--ops", "async", "--sizes", "7"}, 240s, {{"DDPRUN_SHM", "0"}}), 3);
}

// ---- the same matrix with shared memory forced off: every collective over TCP ----

TEST_CASE("every collective x reduce op x dtype at sizes 0 1 7 over TCP only with world sizes 2 3 and 8",
          "[e2e][collectives][tcp]") {
  for (int world : {2, 3, 8}) {
    INFO("world size " << world);
    requireAllOk(runWorkers(world, kSmall, 240s, {{"DDPRUN_SHM", "0"}}), world);
  }
}

TEST_CASE("every collective x reduce op x dtype at 1000003 elements over TCP only with world size 3",
          "[e2e][collectives][tcp][large]") {
  requireAllOk(runWorkers(3, {"--sizes", big()}, 240s, {{"DDPRUN_SHM", "0"}}), 3);
}

// ---- the whole matrix at 1000003 elements ----

TEST_CASE("every collective x reduce op x dtype at 1000003 elements with world size 1", "[e2e][collectives][large]") {
  requireAllOk(runWorkers(1, {"--sizes", big()}), 1);
}

TEST_CASE("every collective x reduce op x dtype at 1000003 elements with world size 2 from every root",
          "[e2e][collectives][large]") {
  requireAllOk(runWorkers(2, {"--sizes", big(), "--roots", "all"}), 2);
}

TEST_CASE("every collective x reduce op x dtype at 1000003 elements with world size 3 from every root",
          "[e2e][collectives][large]") {
  requireAllOk(runWorkers(3, {"--sizes", big(), "--roots", "all"}), 3);
}

// Eight processes on CI's two cores, each running every op at a million elements: 140 s alone
// on a VM whose context switches cost 12 us, and past 240 s beside another test under ctest
// -j2 (2026-11-26). Their bound is the ctest timeout's, less a margin for the report.
constexpr std::chrono::seconds kWorldOf8Timeout{540};

// 73-77 s alone, but 223 s and then past 240 s in two runs beside the 8-rank all-to-all test
// below (12 processes on 2 cores, ctest -j2, 2026-11-26): the 8-rank tests' bound.
TEST_CASE("every collective x reduce op x dtype at 1000003 elements with world size 4", "[e2e][collectives][large]") {
  requireAllOk(runWorkers(4, {"--sizes", big()}, kWorldOf8Timeout), 4);
}

TEST_CASE("point to point and rooted collectives at 1000003 elements with world size 8", "[e2e][collectives][large]") {
  requireAllOk(
      runWorkers(8, {"--sizes", big(), "--ops", "send_recv,isend_irecv,broadcast,reduce,gather,scatter,barrier"},
                 kWorldOf8Timeout),
      8);
}

TEST_CASE("all-to-all style collectives at 1000003 elements with world size 8", "[e2e][collectives][large]") {
  requireAllOk(runWorkers(8,
                          {"--sizes", big(), "--ops",
                           "all_reduce,all_gather,reduce_scatter,all_to_all,all_to_all_uneven,noncontig,async"},
                          kWorldOf8Timeout),
               8);
}

// ---- all_reduce's algorithms: shared memory on one host (the default), TCP otherwise ----

TEST_CASE("all_reduce across the shared-memory slot size", "[e2e][collectives][large]") {
  // 262147 float32 and 1048583 uint8 elements are just over one 1 MiB slot.
  requireAllOk(runWorkers(3, {"--sizes", "262147,1048583", "--ops", "all_reduce,async"}), 3);
}

// DDPRUN_SHM=0 turns the shared-memory all_reduce off: the TCP algorithms run even on one
// host. 16411 elements straddle the 64 KiB switch between recursive doubling and the ring
// (float32 above, float16 below).
// One test per world size: each gets ctest's whole timeout, which three sequential runs
// outgrew on a loaded 2-core CI machine.
namespace {
void requireTcpAllReduceOk(int world) {
  requireAllOk(runWorkers(world, {"--sizes", "0,1,7,16411," + big(), "--ops", "all_reduce,noncontig,async"},
                          world == 8 ? kWorldOf8Timeout : 240s, {{"DDPRUN_SHM", "0"}}),
               world);
}
}  // namespace

TEST_CASE("all_reduce over TCP: recursive doubling and ring with world size 2", "[e2e][collectives][large]") {
  requireTcpAllReduceOk(2);
}

TEST_CASE("all_reduce over TCP: recursive doubling and ring with world size 3", "[e2e][collectives][large]") {
  requireTcpAllReduceOk(3);
}

TEST_CASE("all_reduce over TCP: recursive doubling and ring with world size 4", "[e2e][collectives][large]") {
  requireTcpAllReduceOk(4);
}

TEST_CASE("all_reduce over TCP: recursive doubling and ring with world size 8", "[e2e][collectives][large]") {
  requireTcpAllReduceOk(8);
}

// ---- the checks themselves ----

TEST_CASE("a wrong result is reported as one MISMATCH line and fails the job", "[e2e][collectives]") {
  auto r = runWorkers(2, {"--ops", "all_reduce", "--sizes", "7", "--self-test-corrupt", "all_reduce"}, 60s);
  INFO("stderr:\n" << tail(r.err));
  REQUIRE(r.finished);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("MISMATCH op=all_reduce reduce=SUM dtype=float32 size=7 rank=0 team=world index=3 "
                                    "got="));
  CHECK_THAT(r.err, Catch::Contains("expected="));
}

// ---- subgroups ----

TEST_CASE("every collective inside subgroups from new_group with world size 4", "[e2e][collectives][subgroup]") {
  requireAllOk(runWorkers(4, {"--sizes", "0,1,7", "--teams", "even,odd,reversed,world"}), 4);
}

TEST_CASE("every collective inside subgroups from new_group with world size 5", "[e2e][collectives][subgroup]") {
  requireAllOk(runWorkers(5, {"--sizes", "1,7", "--teams", "even,odd,reversed", "--dtypes", "float16,int32,uint8"}), 5);
}

TEST_CASE("large collectives inside subgroups with world size 8", "[e2e][collectives][subgroup][large]") {
  requireAllOk(runWorkers(8, {"--sizes", "7," + big(), "--teams", "odd,reversed", "--dtypes", "float32,bfloat16",
                              "--reduce-ops", "SUM,MAX,AVG", "--ops",
                              "isend_irecv,broadcast,all_reduce,reduce,all_gather,gather,scatter,reduce_scatter,"
                              "all_to_all_uneven"}),
               8);
}

// ---- backend strings ----

TEST_CASE("backend cpu:gloo (torch's per-device form) runs every collective, in subgroups too",
          "[e2e][collectives][backend]") {
  const auto r = runWorkers(3, {"--backend", "cpu:gloo", "--sizes", "0,7", "--teams", "world,even", "--dtypes",
                                "float32,int64", "--verbose"});
  requireAllOk(r, 3);
  CHECK(countOf(r.out, "backend cpu:gloo (default device cpu), tensors on cpu") == 3);
}

TEST_CASE("backend auto is the host backend for CPU tensors where NCCL is not viable", "[e2e][collectives][backend]") {
  const auto r = runWorkers(2, {"--backend", "auto", "--sizes", "7", "--ops", "all_reduce", "--verbose"});
  requireAllOk(r, 2);
#if !DDPRUN_TEST_TORCH_CUDA
  CHECK(countOf(r.out, "backend gloo (default device cpu), tensors on cpu") == 2);
#endif
}

TEST_CASE("new_group takes a backend of its own, and refuses one that cannot run here", "[e2e][collectives][backend]") {
  requireAllOk(runWorkers(2, {"--teams", "even,world", "--group-backend", "CPU:GLOO", "--sizes", "7", "--ops",
                              "all_reduce,broadcast,all_gather"}),
               2);
#if !DDPRUN_TEST_TORCH_CUDA
  const auto r = runWorkers(2, {"--teams", "even", "--group-backend", "nccl", "--ops", "all_reduce"});
  INFO("stdout:\n" << tail(r.out) << "\nstderr:\n" << tail(r.err));
  REQUIRE(r.finished);
  CHECK(r.exit_code != 0);
  CHECK(countOf(r.err, "new_group: backend 'nccl' asks for NCCL, which is not viable here") >= 1);
  CHECK(countOf(r.err, "new_group: new_group") == 0);
#endif
}

// ---- init methods other than env:// ----

namespace {

// A network namespace of this test's own, loopback up, deleted at the end: tcp:// init makes
// rank 0 serve on the port the URL names, and only a private namespace makes a fixed port safe
// from every other job and test on the machine.
class PrivateNetns {
 public:
  PrivateNetns() : name_("ddprun-tcpinit-" + std::to_string(::getpid())) {
    ok_ = run({"/usr/sbin/ip", "netns", "add", name_}, {}, 10s).exit_code == 0 &&
          run({"/usr/sbin/ip", "-n", name_, "link", "set", "lo", "up"}, {}, 10s).exit_code == 0;
  }
  ~PrivateNetns() { run({"/usr/sbin/ip", "netns", "del", name_}, {}, 10s); }
  bool ok() const { return ok_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  bool ok_ = false;
};

}  // namespace

TEST_CASE("tcp:// init with 3 processes started directly", "[e2e][collectives][init]") {
  PrivateNetns netns;
  if (!netns.ok()) {
    WARN("skipped: cannot create a network namespace here (needs root and iproute2)");
    return;
  }
  std::map<std::string, std::string> env;
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) env[name] = "";
  env["OMP_NUM_THREADS"] = "1";
  std::vector<std::unique_ptr<TestProcess>> procs;
  for (int rank = 0; rank < 3; ++rank) {
    procs.push_back(std::make_unique<TestProcess>(
        std::vector<std::string>{"/usr/sbin/ip", "netns", "exec", netns.name(), workerPath(), "--init",
                                 "tcp://127.0.0.1:29500", "--rank", std::to_string(rank), "--world-size", "3",
                                 "--sizes", "0,1,7", "--teams", "world,even"},
        env));
  }
  requireDirectOk(procs, 120s);
}

TEST_CASE("file:// init with 4 processes started directly", "[e2e][collectives][init]") {
  TempDir dir;
  auto procs = startDirect("file://" + dir.file("init"), 4, {"--sizes", "0,1,7", "--teams", "world,odd"});
  requireDirectOk(procs, 120s);
}

// ---- a peer killed in the middle of a collective ----

namespace {

struct KillOutcome {
  bool exited = false;
  std::chrono::steady_clock::duration elapsed{};
};

// `world` processes (file:// init) loop on all_reduce of 4M floats; `victim` kills itself
// with SIGKILL 500 ms in. The group timeout is 20 s.
KillOutcome runKill(std::vector<std::unique_ptr<TestProcess>>& procs, int world, int victim, bool shm,
                    const std::vector<std::string>& extra = {}) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> args = {"--die-after-ms", "500", "--victim", std::to_string(victim), "--timeout-s", "20"};
  args.insert(args.end(), extra.begin(), extra.end());
  TempDir dir;
  procs = startDirect("file://" + dir.file("init"), world, args, {{"DDPRUN_SHM", shm ? "1" : "0"}});
  KillOutcome outcome;
  outcome.exited = waitAll(procs, 60s);
  outcome.elapsed = std::chrono::steady_clock::now() - start;
  return outcome;
}

std::string deadPeer(int victim) { return "rank " + std::to_string(victim) + " (127.0.0.1:"; }

// Every survivor fails with exit code 3 and "peer error: ..." on stderr, well within the
// timeout; the victim died of SIGKILL; nothing is left running.
void requireSurvivorsFailed(std::vector<std::unique_ptr<TestProcess>>& procs, const KillOutcome& outcome, int victim) {
  for (size_t rank = 0; rank < procs.size(); ++rank) {
    auto& p = *procs[rank];
    INFO("rank " << rank << " stdout:\n" << tail(p.out()) << "\nstderr:\n" << tail(p.err()));
    REQUIRE(outcome.exited);
    if (static_cast<int>(rank) == victim) {
      CHECK(p.termSignal() == SIGKILL);
      continue;
    }
    CHECK(p.exitCode() == 3);
    CHECK(countOf(p.err(), "peer error: ") == 1);
  }
  // A closed connection is seen at once, long before the 20 s timeout.
  CHECK(outcome.elapsed < 15s);
  for (auto& p : procs) CHECK_FALSE(processAlive(p->pid()));
}

void requireAllNameTheDead(std::vector<std::unique_ptr<TestProcess>>& procs, int victim) {
  for (size_t rank = 0; rank < procs.size(); ++rank) {
    if (static_cast<int>(rank) == victim) continue;
    INFO("rank " << rank << " stderr:\n" << tail(procs[rank]->err()));
    CHECK_THAT(procs[rank]->err(), Catch::Contains("peer error: ") && Catch::Contains(deadPeer(victim)));
  }
}

}  // namespace

TEST_CASE("a peer killed during shared-memory all_reduce: every other rank gets a PeerError naming it",
          "[e2e][collectives][fault]") {
  for (auto [world, victim] : {std::pair{3, 1}, std::pair{8, 5}}) {
    INFO("world size " << world << ", victim " << victim);
    std::vector<std::unique_ptr<TestProcess>> procs;
    auto outcome = runKill(procs, world, victim, true);
    requireSurvivorsFailed(procs, outcome, victim);
    requireAllNameTheDead(procs, victim);
  }
}

// 2 MiB a rank: each rank reads the others' blocks straight from their memory; a rank
// killed meanwhile must surface as a PeerError naming it, not as a failed read.
TEST_CASE("a peer killed during large shared-memory all_gather: every other rank gets a PeerError naming it",
          "[e2e][collectives][fault]") {
  std::vector<std::unique_ptr<TestProcess>> procs;
  auto outcome = runKill(procs, 3, 1, true, {"--kill-op", "all_gather", "--big-count", "524288"});
  requireSurvivorsFailed(procs, outcome, 1);
  requireAllNameTheDead(procs, 1);
}

// 4 KiB: the synchronous call runs inline on the caller's thread and takes shared memory's
// one-barrier path; 8 bytes: the data rides on the arrival line (all_reduce and all_gather);
// the dead peer must still surface as a PeerError naming it.
TEST_CASE("a peer killed during small synchronous all_reduce calls: every other rank gets a PeerError naming it",
          "[e2e][collectives][fault]") {
  struct Case {
    bool shm;
    std::vector<std::string> args;
  };
  const std::vector<Case> cases = {{true, {"--big-count", "1024"}},
                                   {true, {"--big-count", "2"}},
                                   {true, {"--kill-op", "all_gather", "--big-count", "2"}},
                                   {false, {"--big-count", "1024"}}};
  for (const auto& c : cases) {
    INFO((c.shm ? "shared memory" : "TCP only") << ", " << c.args.back() << " floats");
    std::vector<std::unique_ptr<TestProcess>> procs;
    auto outcome = runKill(procs, 3, 1, c.shm, c.args);
    requireSurvivorsFailed(procs, outcome, 1);
    if (c.shm) requireAllNameTheDead(procs, 1);
  }
}

namespace {

// Segments are named /ddprun-<run id>-<pid>-...: a run id of this test's own keeps the
// segments of tests running beside it (ctest -j) out of the count.
std::string ownRunId() { return "shmleak" + std::to_string(::getpid()); }

std::vector<std::string> ownShmSegments() { return shmEntriesWithPrefix("ddprun-" + ownRunId() + "-"); }

}  // namespace

TEST_CASE("no shared-memory segment is left in /dev/shm, during a job or after kill -9", "[e2e][collectives][fault]") {
  REQUIRE(ownShmSegments().empty());
  std::vector<std::unique_ptr<TestProcess>> procs;
  TempDir dir;
  procs = startDirect("file://" + dir.file("init"), 3, {"--die-after-ms", "1500", "--victim", "1", "--timeout-s", "20"},
                      {{"DDPRUN_SHM", "1"}, {"TORCHELASTIC_RUN_ID", ownRunId()}});
  // While the ranks are in their all_reduce loop, the segment is mapped but already
  // unlinked; after the victim's SIGKILL and everyone's exit, nothing remains either.
  std::this_thread::sleep_for(1000ms);
  CHECK(ownShmSegments().empty());
  REQUIRE(waitAll(procs, 60s));
  CHECK(ownShmSegments().empty());
}

TEST_CASE("a peer killed during TCP all_reduce: every other rank fails at once", "[e2e][collectives][fault]") {
  for (auto [world, victim] : {std::pair{3, 1}, std::pair{8, 5}}) {
    INFO("world size " << world << ", victim " << victim);
    std::vector<std::unique_ptr<TestProcess>> procs;
    auto outcome = runKill(procs, world, victim, false);
    requireSurvivorsFailed(procs, outcome, victim);
    // The ring's next rank is always receiving from the victim: it sees the close itself.
    const int next = (victim + 1) % world;
    INFO("rank " << next << " stderr:\n" << tail(procs[next]->err()));
    CHECK_THAT(procs[next]->err(), Catch::Contains(deadPeer(victim)));
  }
}

TEST_CASE("a peer killed during TCP all_reduce while the survivors linger: all fail within the timeout",
          "[e2e][collectives][fault]") {
  // Survivors keep their connections open for 90 s after their error, so nobody learns of
  // the death from a neighbour's exit: ranks that do not talk to the dead one must run
  // into the group timeout (4 s), not hang.
  std::vector<std::unique_ptr<TestProcess>> procs;
  const auto start = std::chrono::steady_clock::now();
  TempDir dir;
  procs = startDirect("file://" + dir.file("init"), 8,
                      {"--die-after-ms", "500", "--victim", "5", "--timeout-s", "4", "--linger-ms", "90000"},
                      {{"DDPRUN_SHM", "0"}});
  for (int rank = 0; rank < 8; ++rank) {
    if (rank == 5) continue;
    auto& p = *procs[rank];
    // Under 90 s, when lingering neighbours would let go: hearing of it by then can only
    // come from the 4 s group timeout. 75 s leaves room for 8 starts on a loaded machine
    // (12 s was missed once in a full ctest -j2 run, 16 s in a -j4 run).
    const auto left = 75s - (std::chrono::steady_clock::now() - start);
    INFO("rank " << rank << " stderr:\n" << tail(p.err()));
    CHECK(p.waitForOutput("peer error: ", std::chrono::duration_cast<std::chrono::milliseconds>(left)));
  }
  CHECK_THAT(procs[6]->err(), Catch::Contains(deadPeer(5)));
  // The processes are still lingering; the TestProcess destructors kill them.
}

// Known bug: over TCP a rank learns of a death only from the connection it is blocked on.
// Ranks that are not (at that moment) sending to or receiving from the dead rank fail when
// a neighbour exits and name that neighbour, or, if it lingers, time out naming a live
// rank; even with 3 ranks the victim's left neighbour may have its send already buffered
// and hear of it first from the other survivor's exit.
TEST_CASE("a peer killed during TCP all_reduce: every other rank names it", "[e2e][collectives][fault][.known-bug]") {
  for (auto [world, victim] : {std::pair{3, 1}, std::pair{8, 5}}) {
    INFO("world size " << world << ", victim " << victim);
    std::vector<std::unique_ptr<TestProcess>> procs;
    auto outcome = runKill(procs, world, victim, false);
    requireSurvivorsFailed(procs, outcome, victim);
    requireAllNameTheDead(procs, victim);
  }
}

TEST_CASE("a peer killed during all_reduce under ddprun: root cause first and no worker left",
          "[e2e][collectives][fault]") {
  // A unique element count marks this run's workers on the process table.
  const std::string marker = std::to_string((4 << 20) + ::getpid() % 100000);
  const auto start = std::chrono::steady_clock::now();
  auto r = runWorkers(4, {"--die-after-ms", "500", "--victim", "2", "--timeout-s", "20", "--big-count", marker}, 90s);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  INFO("stdout:\n" << tail(r.out));
  INFO("stderr:\n" << tail(r.err));
  REQUIRE(r.finished);
  CHECK(r.exit_code == 1);
  // The killed rank is the root cause, whatever the survivors did meanwhile.
  const auto root = r.err.find("Root cause (first failure):");
  REQUIRE(root != std::string::npos);
  const std::string first = r.err.substr(root, 400);
  CHECK_THAT(first, Catch::Contains("rank      : 2 ") && Catch::Contains("killed by SIGKILL"));
  CHECK(elapsed < 40s);
  CHECK(eventually([&] { return workersWith(marker).empty(); }, 5s));
}

// ---- the tutorial's ring allreduce, rewritten on isend/recv ----

TEST_CASE("the ring_allreduce trainer matches all_reduce with 3 workers", "[e2e][collectives][trainer]") {
  auto r =
      run({ddprunPath(), "--standalone", "--nproc_per_node=3", "--no_python", binDir() + "/ring_allreduce"}, {}, 60s);
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(countOf(r.out, "ring allreduce [6, 12, 18, 24, 30, 36, ...] == dist::all_reduce") == 3);
}

TEST_CASE("ddprun::dist records each message in the point-to-point ring with its peer count and dtype",
          "[e2e][collectives]") {
  auto r = runWorkers(2, {"--ops", "send_recv,isend_irecv,all_reduce", "--dtypes", "int64", "--reduce-ops", "SUM",
                          "--sizes", "7", "--async", "never", "--flight-summary"});
  requireAllOk(r, 2);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string peer = std::to_string(1 - rank);
    auto lineOf = [&](const std::string& prefix) {
      const auto at = r.out.find(prefix);
      return at == std::string::npos ? std::string() : r.out.substr(at, r.out.find('\n', at) - at);
    };
    const std::string messages = lineOf("flight p2p rank " + std::to_string(rank) + ": ");
    const std::string collectives = lineOf("flight rank " + std::to_string(rank) + ": ");
    INFO(messages << "\n" << collectives);
    REQUIRE(!messages.empty());
    CHECK_THAT(messages, Catch::Contains(" send int64 n=7 peer=" + peer + " x"));
    CHECK_THAT(messages, Catch::Contains(" recv int64 n=7 peer=" + peer + " x"));
    CHECK_THAT(messages, !Catch::Contains("all_reduce") && !Catch::Contains("bytes"));
    CHECK_THAT(messages, Catch::EndsWith(" pending=0"));
    // The collectives' ring holds collectives only.
    REQUIRE(!collectives.empty());
    CHECK_THAT(collectives, Catch::Contains(" all_reduce int64 x"));
    CHECK_THAT(collectives, !Catch::Contains("send") && !Catch::Contains("recv"));
  }
}

TEST_CASE("ddprun::dist labels each collective in the flight recorder with its op and dtype", "[e2e][collectives]") {
  auto r = runWorkers(2, {"--ops", "broadcast,all_reduce,all_gather,barrier", "--dtypes", "int64", "--reduce-ops",
                          "SUM", "--sizes", "7", "--async", "never", "--flight-summary"});
  requireAllOk(r, 2);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string prefix = "flight rank " + std::to_string(rank) + ": ";
    const auto at = r.out.find(prefix);
    REQUIRE(at != std::string::npos);
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    INFO(line);
    CHECK_THAT(line, Catch::Contains(" broadcast int64 x"));
    CHECK_THAT(line, Catch::Contains(" all_reduce int64 x"));
    CHECK_THAT(line, Catch::Contains(" all_gather int64 x"));
    CHECK_THAT(line, Catch::Contains(" barrier bytes x"));
    CHECK_THAT(line, !Catch::Contains("operation"));  // nothing unlabelled
    CHECK_THAT(line, Catch::EndsWith(" pending=0"));
  }
}
