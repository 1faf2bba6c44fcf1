#include "agent/hang/python/python_stacks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include <catch2/catch.hpp>

#include "tests/support/bounded_call.h"
#include "tests/support/test_process.h"

namespace ddprun::agent {
namespace {

// Lines torch printed on a worker's stderr, by version. torch 1.13's gloo ones were recorded on
// this machine (Debian 12's python3-torch); the others are built from the format strings of
// torch's sources (gloo's transport/tcp/unbound_buffer.cc, ProcessGroupNCCL.cpp of 2.6 and
// 2.11), with "[rank0]:" as torch 2.x's and ddprun's --tee prefix put it there.
const char* const kFailureLines[] = {
    // torch 1.13, gloo (recorded)
    "RuntimeError: [./gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv operation to complete",
    "RuntimeError: [./gloo/transport/tcp/unbound_buffer.cc:133] Timed out waiting 5000ms for send operation to "
    "complete",
    // torch 1.13, NCCL
    "[E ProcessGroupNCCL.cpp:737] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, "
    "OpType=ALLREDUCE, Timeout(ms)=5000) ran for 5381 milliseconds before timing out.",
    "[E ProcessGroupNCCL.cpp:414] Some NCCL operations have failed or timed out. Due to the asynchronous nature of "
    "CUDA "
    "kernels, subsequent GPU operations might run on corrupted/incomplete data. To avoid this inconsistency, we are "
    "taking the entire process down.",
    "RuntimeError: NCCL communicator was aborted on rank 1.  Original reason for failure was: [Rank 1] Watchdog caught "
    "collective operation timeout",
    // torch 2.6, gloo and NCCL
    "[rank0]: torch.distributed.DistBackendError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed "
    "out waiting 5000ms for recv operation to complete",
    "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran for "
    "600081 milliseconds before timing out.",
    // torch 2.11, NCCL
    "[rank0]:[E1127 03:12:40.118272061 ProcessGroupNCCL.cpp:2057] [PG ID 0 PG GUID 0(default_pg) Rank 0] Process group "
    "watchdog thread terminated with exception: [Rank 0] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=10000) ran for 10084 milliseconds before "
    "timing out.",
    "[rank1]:[E1127 03:12:40.221 ProcessGroupNCCL.cpp:696] [PG ID 0 PG GUID 0(default_pg) Rank 1] Some NCCL operations "
    "have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
    "corrupted/incomplete data.",
    "torch.distributed.DistBackendError: NCCL error in: "
    "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, "
    "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.28.9",
};

TEST_CASE("torch's collective failure lines of 1.13, 2.6 and 2.11 are recognised", "[unit]") {
  for (const char* line : kFailureLines) {
    INFO(line);
    auto found = collectiveFailureIn(std::string(line) + "\n");
    REQUIRE(found);
    CHECK(found->size() <= 300);
  }
}

TEST_CASE("other errors are not collective failures", "[unit]") {
  for (const char* line : {
           "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
           "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
           "RuntimeError: [./gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:23456",
           "ValueError: the data loader timed out",
           "epoch 3 loss 0.25",
       }) {
    INFO(line);
    CHECK_FALSE(collectiveFailureIn(line));
  }
}

TEST_CASE("the failure line is found among others and returned trimmed", "[unit]") {
  auto found = collectiveFailureIn(
      "Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\n"
      "  RuntimeError: [x.cc:81] Timed out waiting 5000ms for recv operation to complete  \r\nmore\n");
  REQUIRE(found);
  CHECK(*found == "RuntimeError: [x.cc:81] Timed out waiting 5000ms for recv operation to complete");
}

// A faulthandler dump as torch 1.13's rank 1 wrote it on this machine (sleeping), with a thread
// of its own added.
const char* const kDump =
    "Thread 0x00007f4b65f9f6c0 (most recent call first):\n"
    "  File \"/job/loader.py\", line 3 in worker\n"
    "  File \"/usr/lib/python3.11/threading.py\", line 975 in run\n"
    "  File \"/usr/lib/python3.11/threading.py\", line 995 in _bootstrap\n"
    "\n"
    "Current thread 0x00007f8a0e1592c0 (most recent call first):\n"
    "  File \"/tmp/i34b/sleeper.py\", line 11 in <module>";

TEST_CASE("the main thread of a faulthandler dump is the one that started in <module>", "[unit]") {
  auto frames = mainThreadFrames(kDump);
  REQUIRE(frames.size() == 1);
  CHECK(frames[0] == PyFrame{"/tmp/i34b/sleeper.py", 11, "<module>"});
  // The signal may land on another thread: the current one is then not the main one.
  const std::string other_current =
      "Current thread 0x1 (most recent call first):\n  File \"/usr/lib/python3.11/threading.py\", line 320 in wait\n"
      "  File \"/usr/lib/python3.11/threading.py\", line 995 in _bootstrap\n\n"
      "Thread 0x2 (most recent call first):\n"
      "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 1541 in all_reduce\n"
      "  File \"/job/train.py\", line 12 in step\n  File \"/job/train.py\", line 30 in <module>\n";
  frames = mainThreadFrames(other_current);
  REQUIRE(frames.size() == 3);
  CHECK(frames.front().function == "<module>");
  CHECK(frames.back().function == "all_reduce");
  CHECK(mainThreadFrames("no frames here").empty());
}

TEST_CASE("the last traceback of a stderr, with or without rank prefixes", "[unit]") {
  const std::string tail =
      "[rank0]:Traceback (most recent call last):\n"
      "[rank0]:  File \"/tmp/m.py\", line 13, in <module>\n"
      "[rank0]:    dist.all_reduce(t)\n"
      "[rank0]:  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 1541, in "
      "all_reduce\n"
      "[rank0]:    work.wait()\n"
      "[rank0]:RuntimeError: [./gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms\n"
      "[rank0]:  File \"not/a/frame.py\", line 1, in x\n";
  auto frames = lastTraceback(tail);
  REQUIRE(frames.size() == 2);
  CHECK(frames[0] == PyFrame{"/tmp/m.py", 13, "<module>"});
  CHECK(frames[1].function == "all_reduce");
  CHECK(lastTraceback("nothing").empty());
}

TEST_CASE("ddprun's recording wrapper is left out of a rank's frames, so the caller is the user's line", "[unit]") {
  const std::string dump =
      "Current thread 0x1 (most recent call first):\n"
      "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 1541 in all_reduce\n"
      "  File \"/tmp/run/python_hook/_ddprun_progress.py\", line 330 in call\n"
      "  File \"/job/train.py\", line 12 in <module>\n";
  const auto frames = mainThreadFrames(dump);
  REQUIRE(frames.size() == 2);
  auto call = collectiveCallOf(frames);
  REQUIRE(call);
  CHECK(call->site == PyFrame{"/job/train.py", 12, "<module>"});
  const std::string traceback =
      "Traceback (most recent call last):\n"
      "  File \"/job/train.py\", line 12, in <module>\n    dist.all_reduce(t)\n"
      "  File \"/tmp/run/python_hook/_ddprun_progress.py\", line 330, in call\n    result = fn(*args, **kwargs)\n"
      "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 1541, in all_reduce\n"
      "    work.wait()\nRuntimeError: timed out\n";
  const auto tb = lastTraceback(traceback);
  REQUIRE(tb.size() == 2);
  CHECK(tb[0] == PyFrame{"/job/train.py", 12, "<module>"});
  CHECK(tb[1].function == "all_reduce");
}

std::vector<PyFrame> inCall(const std::string& op, int line, bool logger_wrapper = false) {
  std::vector<PyFrame> f = {{"/job/train.py", 40, "<module>"}, {"/job/train.py", line, "step"}};
  if (logger_wrapper) f.push_back({"/usr/lib/python3/dist-packages/torch/distributed/c10d_logger.py", 83, "wrapper"});
  f.push_back({"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", 1541, op});
  return f;
}

TEST_CASE("the collective a rank is in, past torch 2.x's logger wrapper", "[unit]") {
  auto call = collectiveCallOf(inCall("all_reduce", 12, true));
  REQUIRE(call);
  CHECK(call->op == "all_reduce");
  CHECK(call->site == PyFrame{"/job/train.py", 12, "step"});
  CHECK_FALSE(collectiveCallOf({{"/job/train.py", 11, "<module>"}}));
}

TEST_CASE("torch's @record wrapper around main is not a collective", "[unit]") {
  const PyFrame record = {"/usr/lib/python3/dist-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py",
                          346, "wrapper"};
  std::vector<PyFrame> sleeping = {
      {"/job/stuck.py", 13, "<module>"}, record, {"/job/stuck.py", 11, "main"}, {"/job/stuck.py", 4, "stuck"}};
  CHECK_FALSE(collectiveCallOf(sleeping));
  std::vector<PyFrame> waiting = {
      {"/job/stuck.py", 13, "<module>"},
      record,
      {"/job/stuck.py", 12, "main"},
      {"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", 1541, "all_reduce"}};
  auto call = collectiveCallOf(waiting);
  REQUIRE(call);
  CHECK(call->op == "all_reduce");
  CHECK(call->site == PyFrame{"/job/stuck.py", 12, "main"});
  auto verdict = pythonHangVerdict({{0, waiting, true}, {1, sleeping, false}});
  REQUIRE(verdict);
  CHECK(verdict->culprits == std::vector<int>{1});
  CHECK_THAT(verdict->text, Catch::StartsWith("hang: rank 1 is not in a collective, at /job/stuck.py:4 in stuck;"));
}

TEST_CASE("a rank outside any collective is behind, with its frame", "[unit]") {
  std::vector<RankFrames> ranks = {{0, inCall("all_reduce", 12), true},
                                   {1, {{"/job/train.py", 11, "<module>"}}, false},
                                   {2, inCall("all_reduce", 12), false}};
  auto verdict = pythonHangVerdict(ranks);
  REQUIRE(verdict);
  CHECK(verdict->culprits == std::vector<int>{1});
  CHECK(verdict->text ==
        "hang: rank 1 is not in a collective, at /job/train.py:11 in <module>; ranks 0,2 wait in all_reduce (called "
        "at /job/train.py:12 in step) — rank 1 is behind");
}

TEST_CASE("a rank in another collective is a mismatch, and a tie goes to the lowest rank's call", "[unit]") {
  std::vector<RankFrames> ranks = {{0, inCall("all_reduce", 13), true}, {1, inCall("broadcast", 11), true}};
  auto verdict = pythonHangVerdict(ranks);
  REQUIRE(verdict);
  CHECK(verdict->culprits == std::vector<int>{1});
  CHECK(verdict->text ==
        "hang: rank 1 called broadcast at /job/train.py:11 in step; rank 0 waits in all_reduce (called at "
        "/job/train.py:13 in step) — rank 1 called something else");
  // Three ranks: the majority's call is the others'.
  ranks = {
      {0, inCall("broadcast", 11), true}, {1, inCall("all_reduce", 13), true}, {2, inCall("all_reduce", 13), true}};
  verdict = pythonHangVerdict(ranks);
  REQUIRE(verdict);
  CHECK(verdict->culprits == std::vector<int>{0});
}

TEST_CASE("no verdict when every rank is in the same call, or none is, or nothing is known", "[unit]") {
  CHECK_FALSE(pythonHangVerdict({{0, inCall("all_reduce", 12), true}, {1, inCall("all_reduce", 12), false}}));
  CHECK_FALSE(pythonHangVerdict({{0, {{"/job/a.py", 1, "<module>"}}, true}, {1, {}, false}}));
  CHECK_FALSE(pythonHangVerdict({{0, inCall("all_reduce", 12), true}, {1, {}, false}}));
  CHECK_FALSE(pythonHangVerdict({}));
}

TEST_CASE("a frame is described with its source line when one is given", "[unit]") {
  CHECK(describeFrame({"/job/a.py", 11, "<module>"}) == "/job/a.py:11 in <module>");
  CHECK(describeFrame({"/job/a.py", 11, "<module>"}, "time.sleep(60)") == "/job/a.py:11 in <module>: time.sleep(60)");
  CHECK(sourceLine({"/nonexistent/x.py", 3, "f"}).empty());
  CHECK(sourceLine({"<stdin>", 3, "f"}).empty());
}

TEST_CASE("a source line is read from a file or a link to one, never from a FIFO a traceback names", "[unit]") {
  using namespace std::chrono_literals;
  testing::TempDir dir;
  std::ofstream(dir.file("train.py")) << "import time\n  time.sleep(60)  \n";
  CHECK(sourceLine({dir.file("train.py"), 2, "<module>"}) == "time.sleep(60)");
  CHECK(sourceLine({dir.file("train.py"), 3, "<module>"}).empty());
  REQUIRE(::symlink(dir.file("train.py").c_str(), dir.file("linked.py").c_str()) == 0);
  CHECK(sourceLine({dir.file("linked.py"), 1, "<module>"}) == "import time");
  // A worker's traceback may name any path: a FIFO there must not block the agent.
  REQUIRE(::mkfifo(dir.file("fifo.py").c_str(), 0600) == 0);
  auto empty = [](const std::string& line) { return line.empty(); };
  CHECK(testing::callWithin(
            10s,
            [&] {
              return sourceLine({dir.file("fifo.py"), 1, "f"});
            },
            empty) == testing::BoundedCall::kReturned);
  CHECK(testing::callWithin(
            10s,
            [&] {
              return sourceLine({"/dev/zero", 1, "f"});
            },
            empty) == testing::BoundedCall::kReturned);
}

}  // namespace
}  // namespace ddprun::agent
