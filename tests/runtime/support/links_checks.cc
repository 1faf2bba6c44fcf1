#include "tests/runtime/support/links_checks.h"

#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "tests/runtime/support/reference_values.h"

namespace ddprun::testing {

using runtime::Clock;
using runtime::Transfer;

void exchangeWithEveryPeer(runtime::Links& links, size_t bytes, int salt) {
  const int p = links.size(), r = links.rank();
  std::vector<std::vector<uint8_t>> sends(p), recvs(p);
  std::vector<Transfer> transfers;
  for (int peer = 0; peer < p; ++peer) {
    if (peer == r) continue;
    sends[peer] = patternBlock(r, peer, bytes, salt);
    recvs[peer].assign(bytes, 0xEE);
    transfers.push_back(Transfer{peer, true, sends[peer].data(), bytes, {}, 0, 0});
    transfers.push_back(Transfer{peer, false, recvs[peer].data(), bytes, {}, 0, 0});
  }
  links.exchange(transfers, Clock::now() + std::chrono::seconds(20), "exchange test");
  for (const auto& t : transfers) {
    if (t.done != t.bytes) {
      throw std::runtime_error(fmt::format("exchange returned with {} of {} bytes done", t.done, t.bytes));
    }
  }
  for (int peer = 0; peer < p; ++peer) {
    if (peer != r) checkPattern("exchange", recvs[peer].data(), bytes, peer, r, salt);
  }
}

void checkProgressReports(runtime::Links& links, size_t bytes, size_t step, int salt) {
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  if (links.rank() == 0) {
    auto data = patternBlock(0, 1, bytes, salt);
    Transfer t{1, true, data.data(), bytes, {}, 0, 0};
    links.exchange({&t, 1}, deadline, "progress test");
    return;
  }
  std::vector<uint8_t> data(bytes, 0xEE);
  std::vector<size_t> reports;
  Transfer t{0,
             false,
             data.data(),
             bytes,
             [&](size_t received) {
               // What has been reported must already be in the buffer: a reduction reads it.
               checkPattern("progress test (reported bytes)", data.data(), received, 0, 1, salt);
               reports.push_back(received);
             },
             step,
             0};
  links.exchange({&t, 1}, deadline, "progress test");
  checkPattern("progress test", data.data(), bytes, 0, 1, salt);
  if (bytes > 0 && (reports.empty() || reports.back() != bytes)) {
    throw std::runtime_error(fmt::format("progress reports of {} bytes do not end at the total", bytes));
  }
  for (size_t i = 0; i < reports.size(); ++i) {
    const size_t before = i == 0 ? 0 : reports[i - 1];
    if (reports[i] <= before) {
      throw std::runtime_error(fmt::format("progress report {} ({}) after {}", i, reports[i], before));
    }
    if (step > 0 && reports[i] != bytes && reports[i] / step == before / step) {
      throw std::runtime_error(
          fmt::format("progress report at {} crossed no multiple of {} after {}", reports[i], step, before));
    }
  }
}

}  // namespace ddprun::testing
