// Running programs (ddprun above all) from tests: output captured, every wait bounded,
// and whatever is still running at the end killed, process group and all.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/unique_fd.h"

namespace ddprun::testing {

using namespace std::chrono_literals;

// build/bin and the source tree, fixed at configure time.
std::string binDir();
std::string sourceDir();
std::string ddprunPath();
std::string testWorkerPath();
// The Python with PyTorch that torch-labelled tests run: $DDPRUN_TEST_PYTHON where set (the
// torch 2.x tier sets scripts/torch2-python, torch 2.6 in its Debian 13 root), else Debian
// 12's /usr/bin/python3 (torch 1.13; the python3 first on PATH may lack torch).
std::string pythonPath();

class TestProcess {
 public:
  // Starts argv[0] (a path) in its own process group with the current environment
  // plus `env` (an empty value unsets the variable). Stdin is /dev/null.
  explicit TestProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {});
  // Kills the process group with SIGKILL if the process is still running, and reaps it.
  ~TestProcess();
  TestProcess(const TestProcess&) = delete;
  TestProcess& operator=(const TestProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Reads output until stdout+stderr holds `count` occurrences of `needle`, the process
  // exits, or `timeout` passes. Returns whether the needle count was reached.
  bool waitForOutput(const std::string& needle, std::chrono::milliseconds timeout, int count = 1);
  // Waits for exit, reading output. Returns false on timeout (the process keeps running).
  bool wait(std::chrono::milliseconds timeout);
  void signal(int sig);

  bool exited() const { return exited_; }
  int exitCode() const { return exit_code_; }  // -1 unless it exited normally.
  int termSignal() const { return term_signal_; }
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

 private:
  // Reads what either stream has, waiting at most `slice` for it (returns at the first read).
  void pump(std::chrono::milliseconds slice);
  void reap(bool block);
  // Reaps the process once it exits, waiting at most until `deadline` (on the exit itself).
  void reapWithin(std::chrono::steady_clock::time_point deadline);
  void ended(int status);
  static std::chrono::milliseconds until(std::chrono::steady_clock::time_point deadline);

  pid_t pid_ = -1;
  UniqueFd out_fd_;  // closed at the end of the stream
  UniqueFd err_fd_;
  bool exited_ = false;
  int exit_code_ = -1;
  int term_signal_ = 0;
  std::string out_;
  std::string err_;
};

struct RunResult {
  bool finished = false;  // false: timed out and was killed.
  int exit_code = -1;
  int term_signal = 0;
  std::string out;
  std::string err;
};

// Runs to completion within `timeout`.
RunResult run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
              std::chrono::milliseconds timeout = 60s);

// Counts occurrences of `needle` in `text`.
int countOf(const std::string& text, const std::string& needle);

// A fresh directory under $TMPDIR, removed on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The port that a ddprun started with --rdzv_endpoint=127.0.0.1:0 and is_host=true took from
// the kernel, read from its announcement ("serving the rendezvous store on HOST:PORT"); fails
// the test if none comes within `timeout`. Ports come from the kernel, never picked in advance:
// many jobs and tests share a machine.
int announcedPort(TestProcess& host, std::chrono::milliseconds timeout = std::chrono::seconds(30));

// ddprun_store_server on 127.0.0.1 and a port from the kernel (a store that outlives any one
// agent); `port` gets the port it announces. Fails the test if none comes within 10 s.
std::unique_ptr<TestProcess> startStoreServer(int& port);

// A loopback port held for the life of this object by a socket that is bound but never
// listens: a connection to it is refused, and nothing else can take it meanwhile.
class ClosedPort {
 public:
  ClosedPort();
  int port() const { return port_; }

 private:
  UniqueFd fd_;
  int port_ = 0;
};

// True when `pid` exists and is not a zombie.
bool processAlive(pid_t pid);
// Polls until `pred` holds or `timeout` passes (pred's last value). E2e only: scripts/check-unit-waits.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout);

std::string readFile(const std::string& path);
bool fileExists(const std::string& path);
// Names of the entries of /dev/shm that start with `prefix`, sorted (what a job left there).
std::vector<std::string> shmEntriesWithPrefix(const std::string& prefix);

}  // namespace ddprun::testing

#include <thread>

template <class Pred>
bool ddprun::testing::eventually(Pred pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (pred()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
}
