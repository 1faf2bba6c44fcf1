// Runs a call that might block for ever (an open() or read() of a FIFO, say) in a forked
// child, so that a test of "it does not block" fails instead of hanging when it does: the
// child is killed at the deadline. The child reports by exit status: 0 when the call
// returned and `check` (run on its result in the child) held.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

#include "tests/support/child_exit.h"

namespace ddprun::testing {

enum class BoundedCall { kReturned, kCheckFailed, kBlocked };

// Calls `call()` in a child; kReturned when it returned within `timeout` and `check(result)`
// held there, kCheckFailed when it returned and the check did not hold (or it threw), kBlocked
// when it was still running at the deadline (then it is killed and reaped).
template <typename Call, typename Check>
BoundedCall callWithin(std::chrono::milliseconds timeout, Call call, Check check) {
  const pid_t pid = ::fork();
  if (pid < 0) return BoundedCall::kCheckFailed;
  if (pid == 0) {
    int code = 1;
    try {
      code = check(call()) ? 0 : 1;
    } catch (...) {
      code = 2;
    }
    ::_exit(code);
  }
  int status = 0;
  if (!reapWithin(pid, &status, timeout)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return BoundedCall::kBlocked;
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? BoundedCall::kReturned : BoundedCall::kCheckFailed;
}

}  // namespace ddprun::testing
