#include "rendezvous/board/job_board.h"

#include <algorithm>
#include <charconv>
#include <mutex>
#include <optional>

#include "common/logging.h"
#include "rendezvous/rounds/rendezvous_env.h"

namespace ddprun::rendezvous {
namespace {

using std::chrono::milliseconds;

// The most one node's hang summary may hold (agent/hang/rings/hang_verdict.h: a few thousand positions
// of about a hundred bytes; agent/torch_trace/dump_summary.h: torch's dumps and tracebacks, at most 544 KiB).
constexpr size_t kMaxHangSummaryBytes = 1 << 20;
// What the judging node keeps of all answers together: 256 nodes at the most a summary holds,
// 16,384 nodes at 16 KiB each.
constexpr size_t kMaxHangSummariesBytes = size_t{256} << 20;
// Summaries read in one MULTI_GET: at kMaxHangSummaryBytes each they stay within the board's
// reply limit (kMaxQuickReplyBytes, 16 MiB, in dynamic_rendezvous.cc).
constexpr size_t kHangSummariesPerRead = 15;

std::vector<std::string> splitLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    if (end == std::string::npos) break;  // an unfinished line: not yet a whole answer
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

// A node's summary as posted: at most kMaxHangSummaryBytes, cut at a line, so that the judge's
// batched reads fit one reply.
std::string boundedSummary(const std::string& summary) {
  if (summary.size() <= kMaxHangSummaryBytes) return summary;
  const size_t cut = summary.rfind('\n', kMaxHangSummaryBytes - 1);
  return summary.substr(0, cut == std::string::npos ? 0 : cut + 1);
}

// A line of `hang/answered`: a group rank of the round, in decimal.
std::optional<int> groupRankOf(const std::string& line, int participants) {
  int g = 0;
  const char* end = line.data() + line.size();
  const auto [ptr, ec] = std::from_chars(line.data(), end, g);
  if (ec != std::errc() || ptr != end || line.empty() || g < 0 || g >= participants) return std::nullopt;
  return g;
}

// Progress values read in one MULTI_GET: at agent/hang/rings/progress_summary.h's 128 KiB each,
// 8 MiB, within the board's reply limit (16 MiB).
constexpr size_t kProgressPerRead = 64;

}  // namespace

JobBoard::JobBoard(DynamicRendezvous& rendezvous)
    : rendezvous_(rendezvous), site_(rendezvous.site()), clock_(*site_.clock), log_(logger("rendezvous")) {
  rendezvous.onKeepAlive([this] { refreshHeartbeat(); });
}

JobBoard::~JobBoard() {
  // Returns once no refresh runs on the watcher's thread: then this may go.
  rendezvous_.onKeepAlive({});
}

std::string JobBoard::roundKey(int round, const std::string& name) const {
  return site_.prefix + "r" + std::to_string(round) + "/" + name;
}

StoreClient& JobBoard::store() {
  if (!client_) client_ = site_.backend->connect(site_.store);
  return *client_;
}

void JobBoard::publishStatus(const AgentRecord& record) {
  AgentRecord r = record;
  r.node = site_.node;
  r.address = site_.address;
  r.keep_alive_ms = site_.keep_alive_interval.count();
  r.keep_alive_max_attempt = site_.keep_alive_max_attempt;
  r.heartbeat_ms = wallClockMillis();
  std::lock_guard lock(mutex_);
  status_ = r;
  try {
    // The record first: a reader that finds the name in the list can GET it at once.
    store().set(site_.prefix + agentRecordKey(site_.node), encodeAgentRecord(r));
    if (!registered_) {
      store().append(site_.prefix + agentsListKey(), site_.node + "\n");
      registered_ = true;
    }
  } catch (const StoreError& e) {
    client_.reset();
    log_->debug("cannot publish this node's status ({}): {}", r.state, e.what());
  }
}

// On the rendezvous' watcher thread. When the board is busy (a record being published, a
// hang verdict gathering answers), this refresh is left out rather than waited for: the
// watcher's own keep-alive must not wait behind the board.
void JobBoard::refreshHeartbeat() {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || !status_) return;
  status_->heartbeat_ms = wallClockMillis();
  try {
    store().set(site_.prefix + agentRecordKey(site_.node), encodeAgentRecord(*status_));
  } catch (const StoreError& e) {
    client_.reset();
    log_->debug("cannot refresh this node's status heartbeat: {}", e.what());
  }
}

// The answering nodes name themselves in `hang/answered` (APPEND "g\n"), so that each poll
// costs the judge two round trips for the list and one MULTI_GET per kHangSummariesPerRead new
// answers, however many nodes the round has: reading every `hang/<g>` once per poll made a
// verdict O(nodes) round trips every 100 ms (seconds at 16,384 nodes, past its 5 s wait).
std::vector<std::string> JobBoard::gatherHangSummaries(milliseconds wait, const std::string& mine) {
  std::vector<std::string> answers;
  const auto place = rendezvous_.currentRound();
  if (!place || place->participants < 2) return answers;
  std::lock_guard lock(mutex_);
  hang_answered_round_ = place->round;  // this node answers for itself
  const size_t others = static_cast<size_t>(place->participants - 1);
  const std::string answered_key = roundKey(place->round, "hang/answered");
  std::vector<bool> got(static_cast<size_t>(place->participants), false);
  got[static_cast<size_t>(place->group_rank)] = true;
  size_t received = 0;
  size_t total_bytes = 0;
  try {
    // Its own first, named in the answered list: a node that asks in the same round reads it,
    // as it reads any answer.
    if (!mine.empty()) {
      store().set(roundKey(place->round, "hang/" + std::to_string(place->group_rank)), boundedSummary(mine));
      store().append(answered_key, std::to_string(place->group_rank) + "\n");
    }
    store().set(roundKey(place->round, "hang/request"), site_.node);
    const auto deadline = clock_.now() + wait;
    for (;;) {
      std::vector<std::string> fresh;
      if (store().check({answered_key})) {
        for (const std::string& line : splitLines(store().get(answered_key))) {
          const auto g = groupRankOf(line, place->participants);
          if (!g || got[static_cast<size_t>(*g)]) continue;
          got[static_cast<size_t>(*g)] = true;
          fresh.push_back(roundKey(place->round, "hang/" + line));
        }
      }
      for (size_t first = 0; first < fresh.size(); first += kHangSummariesPerRead) {
        const size_t last = std::min(fresh.size(), first + kHangSummariesPerRead);
        const std::vector<std::string> keys(fresh.begin() + static_cast<std::ptrdiff_t>(first),
                                            fresh.begin() + static_cast<std::ptrdiff_t>(last));
        std::vector<std::string> values = store().multiGet(keys);
        for (size_t i = 0; i < values.size(); ++i) {
          ++received;
          if (values[i].size() > kMaxHangSummaryBytes || total_bytes + values[i].size() > kMaxHangSummariesBytes) {
            log_->warn(
                "hang summary {} of round {} holds {} bytes, more than a node's summary ({}) or all of them "
                "together ({}) can; ignored",
                keys[i], place->round, values[i].size(), kMaxHangSummaryBytes, kMaxHangSummariesBytes);
            continue;
          }
          total_bytes += values[i].size();
          answers.push_back(std::move(values[i]));
        }
      }
      if (received == others || clock_.now() >= deadline) break;
      clock_.sleepFor(std::min<Clock::Duration>(milliseconds(100), deadline - clock_.now()));
    }
  } catch (const StoreError& e) {
    client_.reset();
    log_->warn("hang summaries of round {}: {}; judging with {} of {} other nodes", place->round, e.what(),
               answers.size(), others);
  }
  return answers;
}

bool JobBoard::hangSummaryRequested() {
  const auto place = rendezvous_.currentRound();
  if (!place || place->participants < 2 || hang_answered_round_ == place->round) return false;
  std::lock_guard lock(mutex_);
  try {
    return store().check({roundKey(place->round, "hang/request")});
  } catch (const StoreError& e) {
    client_.reset();
    log_->debug("cannot check for a hang summary request: {}", e.what());
    return false;
  }
}

void JobBoard::publishHangSummary(const std::string& summary) {
  const auto place = rendezvous_.currentRound();
  if (!place) return;
  std::lock_guard lock(mutex_);
  hang_answered_round_ = place->round;
  try {
    const std::string bounded = boundedSummary(summary);
    if (bounded.size() < summary.size()) {
      log_->warn("this node's hang summary holds {} bytes; sending its first {}", summary.size(), bounded.size());
    }
    store().set(roundKey(place->round, "hang/" + std::to_string(place->group_rank)), bounded);
    store().append(roundKey(place->round, "hang/answered"), std::to_string(place->group_rank) + "\n");
  } catch (const StoreError& e) {
    client_.reset();
    log_->warn("cannot publish this node's hang summary: {}", e.what());
  }
}

void JobBoard::publishProgress(const std::string& value) {
  const auto place = rendezvous_.currentRound();
  if (!place) return;
  std::lock_guard lock(mutex_);
  try {
    // The value first: a reader that finds the node named can MULTI_GET it at once.
    store().set(roundKey(place->round, "progress/" + std::to_string(place->group_rank)), value);
    if (progress_named_round_ != place->round) {
      store().append(roundKey(place->round, "progress/nodes"), std::to_string(place->group_rank) + "\n");
      progress_named_round_ = place->round;
    }
  } catch (const StoreError& e) {
    client_.reset();
    log_->debug("cannot publish this node's progress: {}", e.what());
  }
}

std::vector<std::string> JobBoard::readProgress(size_t max_each, size_t max_total) {
  std::vector<std::string> values;
  const auto place = rendezvous_.currentRound();
  if (!place) return values;
  std::lock_guard lock(mutex_);
  try {
    for (auto& [g, value] :
         readRoundProgress(store(), site_.prefix, place->round, place->participants, max_each, max_total)) {
      values.push_back(std::move(value));
    }
  } catch (const StoreError& e) {
    client_.reset();
    log_->debug("cannot read the nodes' progress: {}", e.what());
  }
  return values;
}

void JobBoard::publishProgressMedians(const std::string& value) {
  const auto place = rendezvous_.currentRound();
  if (!place) return;
  std::lock_guard lock(mutex_);
  try {
    store().set(roundKey(place->round, "progress/medians"), value);
  } catch (const StoreError& e) {
    client_.reset();
    log_->debug("cannot publish the progress medians: {}", e.what());
  }
}

std::string JobBoard::readProgressMedians(size_t max_bytes) {
  const auto place = rendezvous_.currentRound();
  if (!place) return {};
  std::lock_guard lock(mutex_);
  try {
    const std::string key = roundKey(place->round, "progress/medians");
    if (!store().check({key})) return {};
    std::string value = store().get(key);
    if (value.size() > max_bytes) {
      log_->debug("{} holds {} bytes, more than the {} it may; ignored", key, value.size(), max_bytes);
      return {};
    }
    return value;
  } catch (const StoreError& e) {
    client_.reset();
    log_->debug("cannot read the progress medians: {}", e.what());
    return {};
  }
}

std::vector<std::pair<int, std::string>> readRoundProgress(Store& store, const std::string& prefix, int round,
                                                           int participants, size_t max_each, size_t max_total) {
  std::vector<std::pair<int, std::string>> out;
  const std::string base = prefix + "r" + std::to_string(round) + "/progress/";
  // GET waits for a missing key: the list is CHECKed first, and only the nodes it names are read.
  if (participants <= 0 || !store.check({base + "nodes"})) return out;
  std::vector<bool> named(static_cast<size_t>(participants), false);
  std::vector<int> ranks;
  for (const std::string& line : splitLines(store.get(base + "nodes"))) {
    const auto g = groupRankOf(line, participants);
    if (!g || named[static_cast<size_t>(*g)]) continue;
    named[static_cast<size_t>(*g)] = true;
    ranks.push_back(*g);
  }
  std::sort(ranks.begin(), ranks.end());
  size_t total = 0;
  for (size_t first = 0; first < ranks.size(); first += kProgressPerRead) {
    const size_t last = std::min(ranks.size(), first + kProgressPerRead);
    std::vector<std::string> keys;
    for (size_t i = first; i < last; ++i) keys.push_back(base + std::to_string(ranks[i]));
    std::vector<std::string> values = store.multiGet(keys);
    for (size_t i = 0; i < values.size() && i < keys.size(); ++i) {
      if (values[i].size() > max_each) continue;
      if (total + values[i].size() > max_total) return out;
      total += values[i].size();
      out.emplace_back(ranks[first + i], std::move(values[i]));
    }
  }
  return out;
}

}  // namespace ddprun::rendezvous
