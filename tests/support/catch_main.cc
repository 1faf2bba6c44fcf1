// main() of every Catch2 test executable. The tests run with TMPDIR set to a fresh directory
// of this process's own, so that whatever they (and the ddprun jobs, workers and Python they
// start) leave in TMPDIR is seen: ddprun removes its temporary run directory, timer pipe and
// hook at the end of every run (issue 36), and a test that makes ddprun keep one on purpose
// (a hung worker's stacks, --tee without --log_dir) points TMPDIR at a TempDir of its own.
// Anything still there at the end is named on stderr and fails the executable, then removed.
// The orphan guard of a ddprun killed with SIGKILL removes its run directory a moment after
// the agent died, so leftovers get a bounded while to go first (woken by each removal).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <poll.h>
#include <stdlib.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

std::vector<std::string> entriesOf(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) names.push_back(entry.path().filename().string());
  return names;
}

// The entries of `dir` once none is left, or those still there `guard` from now. Between
// looks it waits for an entry of `dir` to go (inotify), not for a while to pass: a run that
// leaves nothing returns at once, one whose leftovers go returns as the last one does.
std::vector<std::string> leftAfterRemovals(const std::string& dir, std::chrono::milliseconds guard) {
  const int watch = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  // Watched before the first look, so that no removal falls between the look and the watch.
  if (watch >= 0) ::inotify_add_watch(watch, dir.c_str(), IN_DELETE | IN_MOVED_FROM | IN_DELETE_SELF);
  const auto deadline = std::chrono::steady_clock::now() + guard;
  std::vector<std::string> left = entriesOf(dir);
  while (!left.empty() && watch >= 0) {
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (wait.count() <= 0) break;
    pollfd p{watch, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(wait.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    char events[4096];
    while (::read(watch, events, sizeof events) > 0) {
    }
    left = entriesOf(dir);
  }
  if (watch >= 0) ::close(watch);
  return left;
}

}  // namespace

int main(int argc, char* argv[]) {
  const char* outer = std::getenv("TMPDIR");
  // Named after the executable, so that a directory left by a process that never got to the
  // end (killed, or gone through exec or _exit) says whose it was.
  std::string templ = std::string(outer && *outer ? outer : "/tmp") + "/ddprun-tests-" +
                      fs::path(argc > 0 ? argv[0] : "test").filename().string() + "-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) {
    std::perror(("tests: mkdtemp(" + templ + ")").c_str());
    return 1;
  }
  const std::string tmp = templ;
  ::setenv("TMPDIR", tmp.c_str(), 1);

  int rc = Catch::Session().run(argc, argv);

  std::vector<std::string> left = leftAfterRemovals(tmp, std::chrono::seconds(10));
  if (!left.empty()) {
    std::string names;
    for (const auto& name : left) names += " " + name;
    std::fprintf(stderr, "tests: left behind in TMPDIR (%s):%s\n", tmp.c_str(), names.c_str());
    if (rc == 0) rc = 1;
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);
  return rc;
}
