#include "agent/progress_watch.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>
#include <utility>

#include "agent/hang/rings/flight_dir.h"
#include "agent/hang/rings/hang_verdict.h"
#include "agent/hang/rings/progress_summary.h"
#include "common/json_writer.h"
#include "rendezvous/board/job_status.h"

namespace ddprun::agent {
namespace {

namespace fs = std::filesystem;

// The threshold in seconds; 0 when off.
double thresholdOf(const AgentConfig& config) {
  return std::chrono::duration<double>(config.straggler_threshold).count();
}

}  // namespace

ProgressWatch::ProgressWatch(const AgentConfig& config, AgentEnv& env, const WorkerGroup& group, JobReporter& reporter)
    : config_(config),
      env_(env),
      group_(group),
      reporter_(reporter),
      log_(logger("agent")),
      // A tracker needs a threshold above 0; with 0 (off) it is never updated.
      tracker_(std::max(thresholdOf(config), 1e-9)) {}

void ProgressWatch::setUp(AgentRendezvous& rdzv, std::string flight_dir) {
  rendezvous_ = &rdzv;
  flight_dir_ = std::move(flight_dir);
}

void ProgressWatch::workersStarted() {
  watching_ = rendezvous_ != nullptr && !flight_dir_.empty();
  next_look_ = now() + kLookInterval;
}

Clock::TimePoint ProgressWatch::nextLook() const {
  if (!watching_ || group_.stopping()) return Clock::TimePoint::max();
  // The traces' threads are not the loop's: it looks again soon for their end.
  return reading_traces_ ? std::min(traces_due_, now() + kTracePoll) : next_look_;
}

void ProgressWatch::tick() {
  if (!watching_ || group_.stopping()) return;
  if (reading_traces_) {
    if (traces_.busy() && now() < traces_due_) return;
    reading_traces_ = false;
  } else {
    if (now() < next_look_) return;
    next_look_ = now() + kLookInterval;
    // Asked at every look while the workers run: `ddprun status --trace` may be run at any
    // time, and a worker without a trace handler costs a stat (live_positions.h).
    traces_.start(traceSources());
    if (traces_.busy()) {
      reading_traces_ = true;
      traces_due_ = now() + kTraceWait;
      return;
    }
  }
  look();
  // A look can take a while on a slow store: the next one is an interval after this one ended.
  next_look_ = std::max(next_look_, now() + kLookInterval / 5);
}

void ProgressWatch::endAttempt() {
  watching_ = false;
  reading_traces_ = false;
  traces_.forget();
  tracker_.reset();
  reporter_.setStragglers({});
}

// The directory holds only this attempt's rings (hang_watch.h empties it between attempts).
// Only collective rings (".ring"; messages are ".p2pring") and only this node's ranks' are
// read; at most kMaxRingFiles files, whatever the workers put there.
std::vector<FlightRingSnapshot> ProgressWatch::localRings() const {
  std::vector<FlightRingSnapshot> rings;
  std::set<int> mine;
  for (const Worker& w : group_.workers()) mine.insert(w.place.rank);
  std::error_code ec;
  size_t looked = 0;
  for (const auto& entry : fs::directory_iterator(flight_dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (!isFlightRingFileName(name) || !name.ends_with(".ring")) continue;
    if (++looked > kMaxRingFiles) break;
    auto ring = readFlightRingFile(entry.path().string());
    if (ring && ring->kind == FlightRingKind::kCollective && mine.count(ring->rank)) rings.push_back(std::move(*ring));
  }
  return rings;
}

std::vector<LiveTraceReader::Source> ProgressWatch::traceSources() const {
  std::vector<LiveTraceReader::Source> sources;
  for (const Worker& w : group_.workers()) {
    if (w.running && w.python_hook) sources.push_back({w.dir, w.pid, w.place.rank});
  }
  return sources;
}

void ProgressWatch::look() {
  const auto& round = reporter_.round();
  if (!round) return;
  const std::vector<FlightRingSnapshot> rings = localRings();
  // torch's entries are stamped on the wall clock, as the summary is.
  const int64_t unix_ms = rendezvous::wallClockMillis();
  std::vector<TracePosition> traces = traces_.take(unix_ms * 1000000);
  if (rings.empty() && traces.empty()) return;  // workers that keep neither: nothing to say
  // The rings' times are the workers' steady clock, whatever clock the agent runs on.
  const int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  NodeProgress mine;
  mine.unix_ms = unix_ms;
  mine.traces = std::move(traces);
  mine.threshold_s = thresholdOf(config_);
  for (const FlightRingSnapshot& ring : rings) {
    if (auto p = progressOf(ring)) mine.ranks.push_back(*p);
    mine.positions.push_back(positionOf(ring, now_ns));
  }
  rendezvous_->publishProgress(encodeNodeProgress(mine));

  // The groups' medians: computed by the round's first node over every node's summary (its own
  // from its rings, the others' from the store), read by the others.
  std::vector<GroupMedian> medians;
  if (round->group_rank == 0) {
    std::vector<RankProgress> all = mine.ranks;
    std::set<int> local;
    for (const RankProgress& p : mine.ranks) local.insert(p.rank);
    if (round->group_world_size > 1) {
      size_t rejected = 0;
      for (const std::string& value : rendezvous_->readProgress(kMaxProgressBytes, kMaxProgressTotalBytes)) {
        const auto decoded = decodeNodeProgress(value, round->world_size);
        if (!decoded) {
          ++rejected;
          continue;
        }
        rejected += decoded->rejected;
        for (const RankProgress& p : decoded->progress.ranks) {
          if (!local.count(p.rank)) all.push_back(p);
        }
      }
      if (rejected > 0) log_->debug("progress: left out {} lines of the nodes' summaries", rejected);
    }
    medians = groupMedians(all);
    if (round->group_world_size > 1) {
      rendezvous_->publishProgressMedians(encodeJobMedians(JobMedians{mine.unix_ms, medians}));
    }
  } else {
    const auto decoded = decodeJobMedians(rendezvous_->readProgressMedians(kMaxMediansBytes));
    const int64_t max_age_ms = std::chrono::duration_cast<std::chrono::milliseconds>(kMediansMaxAge).count();
    if (decoded && mine.unix_ms - decoded->unix_ms <= max_age_ms) medians = decoded->groups;
  }

  if (config_.straggler_threshold.count() <= 0) return;
  const std::vector<RankLag> lags = lagsOf(mine.ranks, medians);
  const auto changes = tracker_.update(lags);
  if (changes.empty()) return;
  for (const auto& c : changes) {
    const RankLag& l = c.lag;
    if (c.straggling) {
      log_->warn(
          "rank {} is a straggler: it enters collectives {:.3f} s after the median rank of group {} (mean over its "
          "last {}, up to #{}; --straggler_threshold {:.3f} s)",
          l.rank, l.lag_s, l.group, l.collectives, l.last_completed_seq, thresholdOf(config_));
    } else {
      log_->info("rank {} is no longer a straggler: {:.3f} s behind the median rank of group {}", l.rank, l.lag_s,
                 l.group);
    }
    reporter_.emit(c.straggling ? "straggler" : "straggler_end", JsonObject()
                                                                     .add("rank", l.rank)
                                                                     .add("group", l.group)
                                                                     .add("lag_s", l.lag_s)
                                                                     .add("mean_wait_s", l.mean_wait_s)
                                                                     .add("median_wait_s", l.mean_wait_s + l.lag_s)
                                                                     .add("collectives", l.collectives)
                                                                     .add("last_seq", l.last_completed_seq)
                                                                     .add("threshold_s", thresholdOf(config_))
                                                                     .add("attempt", group_.attempt()));
  }
  std::vector<JobReporter::Straggler> now_straggling;
  for (const auto& [rank, l] : tracker_.stragglers()) now_straggling.push_back({l.rank, l.group, l.lag_s});
  reporter_.setStragglers(std::move(now_straggling));
}

}  // namespace ddprun::agent
