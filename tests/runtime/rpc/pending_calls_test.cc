// The table of calls awaiting an answer: a call leaves it once, by its reply or by one of
// the bulk failures (passed deadline, lost connection, shutdown), and the agent's idle
// count hears of every call that left.
#include "worker_runtime/rpc/pending_calls.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>

using ddprun::rpc::Clock;
using ddprun::rpc::Future;
using ddprun::rpc::detail::PendingCall;
using ddprun::rpc::detail::PendingCalls;

namespace {

PendingCall callTo(int peer, const std::string& func, Clock::time_point deadline, Future future = {}) {
  return PendingCall{future, peer, func, -1, deadline, std::chrono::milliseconds(1000), nullptr};
}

std::string failureOf(const Future& f) {
  REQUIRE(f.done());
  try {
    f.value();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(succeeded)";
}

}  // namespace

TEST_CASE("failMatching fails exactly the calls it selects and reports them settled", "[rpc][unit]") {
  size_t settled = 0;
  PendingCalls calls([&](size_t n) { settled += n; });
  const auto t0 = Clock::time_point{} + std::chrono::hours(1);
  Future a, b, c;
  const uint64_t ia = calls.nextId(), ib = calls.nextId(), ic = calls.nextId();
  CHECK(ia != ib);
  CHECK(ib != ic);
  calls.add(ia, callTo(1, "f", t0, a));
  calls.add(ib, callTo(2, "g", t0 + std::chrono::seconds(5), b));
  calls.add(ic, callTo(1, "h", t0 + std::chrono::seconds(9), c));

  const auto error = [](const PendingCall& p) {
    return std::make_exception_ptr(std::runtime_error(p.func + " to " + std::to_string(p.peer) + " failed"));
  };
  // The sweep's selection: deadlines passed at t0 + 5 s.
  const auto now = t0 + std::chrono::seconds(5);
  CHECK(calls.failMatching([now](const PendingCall& p) { return p.deadline <= now; }, error) == 2);
  CHECK(settled == 2);
  CHECK(failureOf(a) == "f to 1 failed");
  CHECK(failureOf(b) == "g to 2 failed");
  CHECK_FALSE(c.done());

  // A call that left the table is not failed again, nor counted twice.
  CHECK(calls.failMatching([](const PendingCall&) { return true; }, error) == 1);
  CHECK(settled == 3);
  CHECK(failureOf(c) == "h to 1 failed");
  CHECK(calls.failMatching([](const PendingCall&) { return true; }, error) == 0);
  CHECK(settled == 3);
}

TEST_CASE("a reply takes its call once and a late one finds nothing", "[rpc][unit]") {
  size_t settled = 0;
  PendingCalls calls([&](size_t n) { settled += n; });
  Future f;
  const uint64_t id = calls.nextId();
  calls.add(id, callTo(1, "f", Clock::now() + std::chrono::hours(1), f));
  auto taken = calls.takeReply(id, nullptr);
  REQUIRE(taken);
  CHECK(taken->func == "f");
  CHECK(settled == 1);
  CHECK_FALSE(calls.takeReply(id, nullptr));
  CHECK_FALSE(calls.fail(id, std::make_exception_ptr(std::runtime_error("late"))));
  CHECK(settled == 1);
  CHECK_FALSE(f.done());  // completing it is the caller's business
}

TEST_CASE("fail completes one pending call with its error", "[rpc][unit]") {
  size_t settled = 0;
  PendingCalls calls([&](size_t n) { settled += n; });
  Future f, g;
  const uint64_t fid = calls.nextId(), gid = calls.nextId();
  calls.add(fid, callTo(1, "f", Clock::now() + std::chrono::hours(1), f));
  calls.add(gid, callTo(1, "g", Clock::now() + std::chrono::hours(1), g));
  CHECK(calls.fail(fid, std::make_exception_ptr(std::runtime_error("write failed"))));
  CHECK(settled == 1);
  CHECK(failureOf(f) == "write failed");
  CHECK_FALSE(g.done());
}
