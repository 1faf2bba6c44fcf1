// The hang watch's verdicts (hang_watch.h): the Python stacks it takes and the three verdicts
// (the flight recorder rings with the other nodes' summaries, torch's dumps, the Python
// frames), each a function of agent/hang/ (stack_taking.h, ring_judgement.h,
// dump_judgement.h, python_frames.h); here, what each is given of the attempt and what the
// watch records of it. Apart from hang_watch.cc, which watches and stops.
#include "agent/hang/python/stack_taking.h"
#include "agent/hang/verdicts/dump_judgement.h"
#include "agent/hang/verdicts/dump_settling.h"
#include "agent/hang/verdicts/python_frames.h"
#include "agent/hang/verdicts/ring_judgement.h"
#include "agent/hang_watch.h"

namespace ddprun::agent {

void HangWatch::takePythonStacks() {
  attempt_.python_stacks_taken = true;
  const StackTakingLoop loop{env_.clock(), [this](Clock::Duration d) { env_.runFor(d); },
                             [this](pid_t pid, int signal) { return env_.signalProcess(pid, signal); }};
  attempt_.live_traces = agent::takePythonStacks(group_.workers(), loop);
}

std::chrono::milliseconds HangWatch::settleTorchDumps() {
  return agent::settleTorchDumps(*attempt_.torch_dumps, env_.clock(), [this](Clock::Duration d) { env_.runFor(d); });
}

std::string HangWatch::judgeTorchDumps(const std::string& trigger) {
  if (!attempt_.torch_dumps && attempt_.live_traces.empty()) return {};
  DumpCase c;
  c.local_ranks = localRanks();
  // The dump files are waited for (once already, before the other nodes were asked) only for
  // ranks without a live trace.
  if (attempt_.torch_dumps && !tracesCover(attempt_.live_traces, c.local_ranks)) {
    c.waited = attempt_.dumps_waited ? *attempt_.dumps_waited : settleTorchDumps();
  }
  c.local = nodeDumps(attempt_.torch_dumps.get(), attempt_.live_traces, c.local_ranks);
  // The files' time, or now for live traces (taken moments ago).
  const int64_t newest = attempt_.torch_dumps ? attempt_.torch_dumps->newestNs() : 0;
  if (c.local.live > 0) {
    c.now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
                   .count();
  } else if (newest > 0) {
    c.now_ns = newest;
  }
  for (const Worker& w : group_.workers()) {
    if (!w.running && w.exit_code == 0 && w.signal == 0) c.finished_ranks.push_back(w.place.rank);
  }
  if (const auto& current = reporter_.round()) c.world_size = current->world_size;
  c.others = [this]() -> const std::vector<std::string>& { return otherNodes(); };
  DumpJudgement judged = judgeDumps(trigger, std::move(c));
  for (const auto& [level, line] : judged.log) log_->log(level, line);
  attempt_.remote_stacks.merge(judged.remote_stacks);  // two nodes claim one rank: the first answer holds
  if (judged.culprits.empty()) return {};
  recordVerdict(trigger, judged.text, "flight_recorder", judged.culprits);
  addRemoteCulprits(std::move(judged.remote_culprits));
  return judged.sentences;
}

void HangWatch::recordVerdict(const std::string& trigger, const std::string& text, const char* source,
                              const std::vector<int>& culprits) {
  JsonObject fields;
  fields.add("trigger", trigger).add("verdict", text);
  if (source) fields.add("source", source);
  fields.add("culprits", rankRanges(culprits)).add("attempt", group_.attempt());
  reporter_.emit("hang_verdict", fields);
  reporter_.setHangVerdict(JobReporter::Verdict{text, source ? source : "flight_ring", culprits, group_.attempt()});
  attempt_.culprits = culprits;
}

void HangWatch::addRemoteCulprits(std::vector<WorkerFailure> culprits) {
  for (WorkerFailure& f : culprits) {
    f.time = std::chrono::system_clock::now();
    attempt_.remote_culprits.push_back(std::move(f));
  }
}

std::string HangWatch::judgePythonHang(const std::string& trigger) {
  // The other nodes' Python ranks as their frames came in their summaries (judgeHang read them).
  const auto verdict =
      pythonHangVerdict(rankFrames(rankEvidence(group_.workers()), attempt_.remote_stacks), &sourceLine);
  if (!verdict) {
    log_->warn("{}; the Python stacks name no rank behind", trigger);
    return {};
  }
  log_->error("{}; {}", trigger, verdict->text);
  recordVerdict(trigger, verdict->text, "python_stacks", verdict->culprits);
  return verdict->text;
}

std::string HangWatch::judgeHang(const std::string& trigger) {
  if (attempt_.hang_judged) return {};
  attempt_.hang_judged = true;
  RingCase c;
  c.local = localPositions();
  c.local_ranks = localRanks();
  const auto& current = reporter_.round();
  c.world_size = current ? current->world_size : 0;
  c.several_nodes = current && current->group_world_size > 1;
  c.python_workers = config_.python_workers;
  c.known_stacks = attempt_.remote_stacks;
  for (const WorkerFailure& f : attempt_.remote_culprits) c.known_remote_culprits.push_back(f.rank);
  c.others = [this]() -> const std::vector<std::string>& { return otherNodes(); };
  RingJudgement judged = judgeRings(trigger, std::move(c));
  for (const auto& [level, line] : judged.log) log_->log(level, line);
  attempt_.remote_stacks.merge(judged.remote_stacks);  // two nodes claim one rank: the first answer holds
  if (!judged.verdict) return {};
  recordVerdict(trigger, judged.verdict->text, nullptr, judged.verdict->culprits);
  addRemoteCulprits(std::move(judged.remote_culprits));
  return judged.verdict->text;
}

std::string HangWatch::judgeRingsAndFrames(const std::string& trigger) {
  const std::string verdict = judgeHang(trigger);
  const auto& workers = group_.workers();
  if (verdict.empty() || std::none_of(workers.begin(), workers.end(), [](const Worker& w) { return w.python_hook; })) {
    return verdict;
  }
  const std::vector<int> ring_culprits = attempt_.culprits;
  const std::string frames = judgePythonHang(trigger);
  if (!ring_culprits.empty()) attempt_.culprits = ring_culprits;
  // The frames first in the report's reason: a Python user reads the script's line first.
  return frames.empty() ? verdict : frames + "; " + verdict;
}

}  // namespace ddprun::agent
