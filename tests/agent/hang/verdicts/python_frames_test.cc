// Each rank's Python frames for the Python verdict (agent/hang/verdicts/python_frames.h)
// alone, on files written here as a worker leaves them: which of a rank's traces is believed
// first, whether it counts as failed, and another node's frames read back from its summary.
#include "agent/hang/verdicts/python_frames.h"

#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "agent/hang/python/python_hook.h"
#include "tests/support/test_process.h"

namespace ddprun::agent {
namespace {

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

std::string traceback(const std::string& file, int line, const std::string& function) {
  return "Traceback (most recent call last):\n  File \"" + file + "\", line " + std::to_string(line) + ", in " +
         function + "\n    f()\nValueError: x\n";
}

}  // namespace

TEST_CASE("python frames: a rank's saved exception is believed before its error file, its stacks and its stderr",
          "[unit]") {
  testing::TempDir dir;
  RankEvidence w;
  w.rank = 3;
  w.running = true;
  w.python_hook = true;
  w.dir = dir.path();
  w.error_file = dir.path() + "/error.json";
  w.python_stack = "Current thread 0x1 (most recent call first):\n  File \"/job/train.py\", line 30 in <module>\n";
  w.stderr_tail = traceback("/job/stderr.py", 4, "main");
  write(pythonExceptionFile(dir.path(), 4242), traceback("/job/exception.py", 7, "step"));
  write(w.error_file,
        R"({"message": {"message": "ValueError: x", "extraInfo": {"py_callstack": ")" +
            std::string("Traceback (most recent call last):\\n  File \\\"/job/error.py\\\", line 9, in load\\n") +
            R"(", "timestamp": "1700000000"}}})");

  std::vector<RankFrames> ranks = rankFrames({w}, {});
  REQUIRE(ranks.size() == 1);
  CHECK(ranks[0].rank == 3);
  CHECK(ranks[0].frames == std::vector<PyFrame>{{"/job/exception.py", 7, "step"}});
  CHECK(ranks[0].failed);  // it is failing, though still running

  // Without ddprun's hook its directory is not read: the error file's traceback.
  w.python_hook = false;
  ranks = rankFrames({w}, {});
  CHECK(ranks[0].frames == std::vector<PyFrame>{{"/job/error.py", 9, "load"}});
  CHECK(ranks[0].failed);

  // Neither: the stacks taken while it ran; it runs, so it has not failed.
  w.error_file = dir.path() + "/none.json";
  ranks = rankFrames({w}, {});
  CHECK(ranks[0].frames == std::vector<PyFrame>{{"/job/train.py", 30, "<module>"}});
  CHECK_FALSE(ranks[0].failed);

  // Its stderr's traceback only once it ended, and only when nothing else is there.
  w.python_stack.clear();
  CHECK(rankFrames({w}, {})[0].frames.empty());
  w.running = false;
  ranks = rankFrames({w}, {});
  CHECK(ranks[0].frames == std::vector<PyFrame>{{"/job/stderr.py", 4, "main"}});
  CHECK(ranks[0].failed);
  w.stderr_tail.clear();
  ranks = rankFrames({w}, {});
  CHECK(ranks[0].frames.empty());
  CHECK(ranks[0].failed);  // it ended: failed, with nothing to show
}

TEST_CASE("python frames: another node's ranks come after this node's, their frames read back from its summary",
          "[unit]") {
  const std::vector<PyFrame> frames = {{"/job/train.py", 30, "<module>"}, {"/job/train.py", 12, "step"}};
  std::map<int, RemoteStack> remote;
  remote[5] = RemoteStack{"node b", 1, formatTraceback(frames)};
  remote[4] = RemoteStack{"node b", 0, ""};
  RankEvidence local;
  local.rank = 0;
  local.running = true;

  const std::vector<RankFrames> ranks = rankFrames({local}, remote);
  REQUIRE(ranks.size() == 3);
  CHECK(ranks[0].rank == 0);
  CHECK(ranks[1].rank == 4);
  CHECK(ranks[1].frames.empty());
  CHECK(ranks[2].rank == 5);
  CHECK(ranks[2].frames == frames);
  CHECK_FALSE(ranks[2].failed);
}

}  // namespace ddprun::agent
