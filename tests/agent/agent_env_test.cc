// The real AgentEnv's event loop (agent/agent_env.h): what the round loop relies on when it
// waits. The round loop's other tests run on the manual env (manual_agent_env.h), whose loop
// is not Asio's own wait, so this is where the real one's edge cases are pinned.
#include <chrono>

#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>

#include "agent/agent_env.h"

namespace ddprun::agent {

TEST_CASE("agent env: a wait whose time is already up still runs what is ready", "[unit]") {
  // The round loop waits until its next look is due; a look that blocked past the next one
  // (a workers' store that is gone) leaves a limit of zero or less. Asio's run_one_for runs
  // nothing then, so a child's exit, a signal to ddprun or the round's end, all handlers on
  // this loop, were never seen again: an agent in the chaos soak ran on forever.
  auto env = AgentEnv::real();
  const auto limit = GENERATE(Clock::Duration::zero(), -Clock::Duration(std::chrono::seconds(1)));
  int ran = 0;
  boost::asio::post(env->io(), [&ran] { ++ran; });
  boost::asio::post(env->io(), [&ran] { ++ran; });
  env->runFor(limit);
  CHECK(ran == 2);
}

}  // namespace ddprun::agent
