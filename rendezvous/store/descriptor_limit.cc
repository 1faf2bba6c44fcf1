#include "rendezvous/store/descriptor_limit.h"

#include <atomic>

#include <sys/resource.h>

#include <fmt/format.h>

namespace ddprun::rendezvous {

namespace {

std::string limitText(uint64_t limit) {
  return limit == static_cast<uint64_t>(RLIM_INFINITY) ? std::string("unlimited") : std::to_string(limit);
}

constexpr const char* kHowToRaise =
    "raise the hard limit of the process that serves the store (ulimit -Hn as root, nofile in "
    "/etc/security/limits.conf, LimitNOFILE= in a systemd unit, --ulimit nofile= for docker)";

}  // namespace

DescriptorPlan planDescriptorLimit(DescriptorLimit current, uint64_t clients) {
  DescriptorPlan plan;
  plan.new_soft = current.soft < current.hard ? current.hard : current.soft;
  const uint64_t needed = clients + kReservedDescriptors;
  if (clients > 0 && current.hard < needed) {
    plan.warning = fmt::format(
        "store: the descriptor limit (hard {}) cannot hold {} client connections (about {} descriptors); {}",
        limitText(current.hard), clients, needed, kHowToRaise);
  }
  return plan;
}

std::string outOfDescriptorsAdvice(DescriptorLimit current) {
  return fmt::format("the descriptor limit is {} (hard {}), one per client connection; to serve more clients, {}",
                     limitText(current.soft), limitText(current.hard), kHowToRaise);
}

namespace {
std::atomic<uint64_t> g_soft_before_raise{0};
}  // namespace

uint64_t descriptorSoftLimitBeforeRaise() { return g_soft_before_raise.load(std::memory_order_acquire); }

DescriptorPlan raiseDescriptorLimit(uint64_t clients, DescriptorLimit* now) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return {};
  DescriptorLimit current{limit.rlim_cur, limit.rlim_max};
  DescriptorPlan plan = planDescriptorLimit(current, clients);
  if (plan.new_soft != current.soft) {
    limit.rlim_cur = plan.new_soft;
    if (setrlimit(RLIMIT_NOFILE, &limit) == 0) {
      uint64_t never = 0;
      g_soft_before_raise.compare_exchange_strong(never, current.soft, std::memory_order_acq_rel);
      current.soft = plan.new_soft;
    }
  }
  if (now) *now = current;
  return plan;
}

}  // namespace ddprun::rendezvous
