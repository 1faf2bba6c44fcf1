#include "rendezvous/store/descriptor_limit.h"

#include <sys/resource.h>

#include <catch2/catch.hpp>

#include "rendezvous/store/store_server.h"

using namespace ddprun::rendezvous;

namespace {

// Lowers the soft descriptor limit for one test and puts it back after.
class LowerSoftLimit {
 public:
  explicit LowerSoftLimit(rlim_t soft) {
    getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit lowered = saved_;
    lowered.rlim_cur = std::min(soft, saved_.rlim_max);
    setrlimit(RLIMIT_NOFILE, &lowered);
  }
  ~LowerSoftLimit() { setrlimit(RLIMIT_NOFILE, &saved_); }
  const rlimit& saved() const { return saved_; }

 private:
  rlimit saved_{};
};

rlimit currentLimit() {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  return limit;
}

}  // namespace

TEST_CASE("planDescriptorLimit raises the soft limit to the hard one", "[descriptor_limit]") {
  CHECK(planDescriptorLimit({1024, 524288}, 0).new_soft == 524288);
  CHECK(planDescriptorLimit({1024, 524288}, 0).warning.empty());
  // Already at the hard limit, or above it (never lowered).
  CHECK(planDescriptorLimit({4096, 4096}, 0).new_soft == 4096);
  CHECK(planDescriptorLimit({8192, 4096}, 0).new_soft == 8192);
  // No hard limit at all.
  const auto infinite = static_cast<uint64_t>(RLIM_INFINITY);
  CHECK(planDescriptorLimit({1024, infinite}, 98304).new_soft == infinite);
  CHECK(planDescriptorLimit({1024, infinite}, 98304).warning.empty());
}

TEST_CASE("planDescriptorLimit warns, naming what to raise, when the hard limit cannot hold the clients",
          "[descriptor_limit]") {
  // Enough: clients plus the reserve fit.
  CHECK(planDescriptorLimit({1024, 98304 + kReservedDescriptors}, 98304).warning.empty());
  // One short.
  const DescriptorPlan plan = planDescriptorLimit({1024, 20000}, 98304);
  CHECK(plan.new_soft == 20000);
  CHECK_THAT(plan.warning, Catch::Contains("hard 20000") && Catch::Contains("98304 client connections") &&
                               Catch::Contains("ulimit -Hn") && Catch::Contains("LimitNOFILE"));
  CHECK(plan.warning.find('\n') == std::string::npos);
  // Unknown client count: nothing to warn about.
  CHECK(planDescriptorLimit({1024, 20000}, 0).warning.empty());
}

TEST_CASE("outOfDescriptorsAdvice states the limit and what to raise", "[descriptor_limit]") {
  const std::string advice = outOfDescriptorsAdvice({20000, 20000});
  CHECK_THAT(advice, Catch::Contains("20000 (hard 20000)") && Catch::Contains("ulimit -Hn"));
  CHECK_THAT(outOfDescriptorsAdvice({1024, static_cast<uint64_t>(RLIM_INFINITY)}), Catch::Contains("hard unlimited"));
}

TEST_CASE("raiseDescriptorLimit sets this process's soft limit to its hard one", "[descriptor_limit]") {
  LowerSoftLimit lowered(64);
  REQUIRE(currentLimit().rlim_cur == std::min<rlim_t>(64, lowered.saved().rlim_max));
  DescriptorLimit now;
  const DescriptorPlan plan = raiseDescriptorLimit(0, &now);
  CHECK(plan.warning.empty());
  CHECK(currentLimit().rlim_cur == lowered.saved().rlim_max);
  CHECK(now.soft == lowered.saved().rlim_max);
  CHECK(now.hard == lowered.saved().rlim_max);
}

TEST_CASE("a store server raises the soft descriptor limit when it starts", "[descriptor_limit][store_server]") {
  LowerSoftLimit lowered(64);
  StoreServerOptions options;
  options.host = "127.0.0.1";
  options.expected_clients = 10;
  StoreServer server(options);
  CHECK(currentLimit().rlim_cur == lowered.saved().rlim_max);
  CHECK(server.port() > 0);
}
