// The hang watch's verdicts (hang_watch.h): the Python stacks it takes and the three verdicts
// (the flight recorder rings with the other nodes' summaries, torch's dumps through
// dump_judgement.h, the Python frames). Apart from hang_watch.cc, which watches and stops, so
// that each file stays short.
#include <algorithm>
#include <filesystem>

#include "agent/hang/python/live_traces.h"
#include "agent/hang/python/python_hook.h"
#include "agent/hang/python/python_stacks.h"
#include "agent/hang/python/stack_summary.h"
#include "agent/hang/python/worker_server_stacks.h"
#include "agent/hang/verdicts/dump_judgement.h"
#include "agent/hang_watch.h"
#include "agent/ops/error_file.h"
#include "common/text_escape.h"

namespace ddprun::agent {
namespace {

// How long the agent waits for the Python workers' stacks after signalling their hook
// (faulthandler writes them from its signal handler, at once, even in a blocked call).
constexpr auto kPythonStacksWait = std::chrono::seconds(2);
constexpr auto kPythonStacksPoll = std::chrono::milliseconds(20);
// torch's flight-recorder dumps (HangWatch::kTorchDumpWait at most): with no dump at all
// after kTorchFirstDumpWait, none is coming (gloo before torch 2.8).
constexpr auto kTorchDumpSettleLook = std::chrono::milliseconds(100);
constexpr auto kTorchFirstDumpWait = std::chrono::seconds(1);

}  // namespace

void HangWatch::takePythonStacks() {
  attempt_.python_stacks_taken = true;
  struct Ask {
    Worker* worker;
    std::string file;
    uintmax_t size = 0;
    bool done = false;
  };
  std::vector<Ask> asks;
  const auto start = now();
  const WaitStep wait = [&](std::chrono::milliseconds step) {
    env_.runFor(step);
    return now() - start;
  };
  const size_t served = stacksFromWorkerServers(group_.workers(), wait);
  // The flight recorder's own record too, while every rank still stands where it hung.
  attempt_.live_traces = tracesFromWorkerServers(group_.workers(), wait);
  if (!attempt_.live_traces.empty()) {
    log_->info("took {} live flight-recorder trace(s) from torch's worker servers", attempt_.live_traces.size());
  }
  for (Worker& w : group_.workers()) {
    if (!w.running || !w.python_hook || !w.python_stack.empty()) continue;
    // The worker itself when it registered the hook, else the first of its processes that did
    // (a wrapper: sh -c python ...); never a pid outside the worker.
    pid_t target = -1;
    for (pid_t pid : registeredPythonPids(w.dir)) {
      if (pid == w.pid) {
        target = pid;
        break;
      }
      if (target < 0 && findOwningWorker(pid, {w.pid}) == w.pid) target = pid;
    }
    if (target <= 1) continue;
    if (env_.signalProcess(target, kPythonStacksSignal) != 0) continue;
    asks.push_back(Ask{&w, pythonStacksFile(w.dir, target)});
  }
  if (asks.empty() && served == 0) return;
  // Done when each file has something and did not grow since the last look.
  for (const auto deadline = start + kPythonStacksWait; now() < deadline;) {
    env_.runFor(kPythonStacksPoll);
    bool all = true;
    for (Ask& a : asks) {
      std::error_code ec;
      const uintmax_t size = std::filesystem::file_size(a.file, ec);
      // One that ended meanwhile writes nothing more (its exception's traceback serves instead).
      a.done = !a.worker->running || (!ec && size > 0 && size == a.size);
      a.size = ec ? 0 : size;
      all = all && a.done;
    }
    if (all) break;
  }
  size_t taken = 0;
  for (Ask& a : asks) {
    a.worker->python_stack = readSmallFile(a.file);
    if (a.worker->python_stack.empty()) continue;
    a.worker->python_stack_file = a.file;
    ++taken;
  }
  log_->info("took the Python stacks of {} of {} worker(s) in {} ms ({} from torch's worker server)", taken + served,
             asks.size() + served, std::chrono::duration_cast<std::chrono::milliseconds>(now() - start).count(),
             served);
}

std::chrono::milliseconds HangWatch::settleTorchDumps() {
  const auto start = now();
  for (;;) {
    if (attempt_.torch_dumps->poll()) break;
    const auto waited = now() - start;
    if (waited >= kTorchDumpWait) break;
    if (waited >= kTorchFirstDumpWait && attempt_.torch_dumps->writtenRanks().empty()) break;
    // The workers' output and exits are served meanwhile; the looks stay apart, so that a
    // file's size holding still means that torch is done writing it.
    const auto next = now() + kTorchDumpSettleLook;
    while (now() < next) env_.runFor(next - now());
  }
  return std::chrono::duration_cast<std::chrono::milliseconds>(now() - start);
}

std::string HangWatch::judgeTorchDumps(const std::string& trigger) {
  if (!attempt_.torch_dumps && attempt_.live_traces.empty()) return {};
  DumpCase c;
  for (const Worker& w : group_.workers()) c.local_ranks.push_back(w.place.rank);
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
  for (WorkerFailure& f : judged.remote_culprits) {
    f.time = std::chrono::system_clock::now();
    attempt_.remote_culprits.push_back(std::move(f));
  }
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

std::string HangWatch::judgePythonHang(const std::string& trigger) {
  std::vector<RankFrames> ranks;
  for (const Worker& w : group_.workers()) {
    RankFrames r;
    r.rank = w.place.rank;
    // An exception's traceback first (the rank failed, or is failing: its stacks may have been
    // taken in its excepthook), then the stacks taken while it ran, then its stderr's traceback.
    if (w.python_hook) r.frames = lastTraceback(readPythonException(w.dir));
    if (r.frames.empty()) {
      if (auto error = readErrorFile(w.error_file)) r.frames = lastTraceback(error->traceback);
    }
    r.failed = !r.frames.empty() || !w.running;
    if (r.frames.empty() && !w.python_stack.empty()) r.frames = mainThreadFrames(w.python_stack);
    if (r.frames.empty() && !w.running && w.stderr_record) r.frames = lastTraceback(w.stderr_record->tail.text());
    ranks.push_back(std::move(r));
  }
  // The other nodes' Python ranks, as their frames came in their summaries (judgeHang read
  // them): formatTraceback's lines, read back as a traceback.
  for (const auto& [rank, stack] : attempt_.remote_stacks) {
    std::string traceback = "Traceback (most recent call last):\n";
    for (std::string_view rest = stack.traceback; !rest.empty();) {
      const size_t newline = rest.find('\n');
      traceback += "  " + std::string(rest.substr(0, newline)) + "\n";
      rest = newline == std::string_view::npos ? std::string_view{} : rest.substr(newline + 1);
    }
    ranks.push_back(RankFrames{rank, lastTraceback(traceback), false});
  }
  const auto verdict = pythonHangVerdict(ranks, &sourceLine);
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
  std::vector<RankPosition> positions = localPositions();
  const auto& current = reporter_.round();
  if (current && current->group_world_size > 1) {
    std::vector<int> local_ranks;
    for (const Worker& w : group_.workers()) local_ranks.push_back(w.place.rank);
    for (const std::string& answer : otherNodes()) {
      SummaryPositions summary = decodeSummary(answer, current->world_size, local_ranks);
      if (summary.rejected > 0) {
        log_->warn(
            "hang verdict: ignored {} position(s) of another node's summary that no rank of this job of {} "
            "can hold",
            summary.rejected, current->world_size);
      }
      positions.insert(positions.end(), summary.positions.begin(), summary.positions.end());
      RemoteStacks stacks = decodeStackSummary(answer, current->world_size, local_ranks);
      if (stacks.rejected > 0) {
        log_->warn("hang verdict: ignored {} Python traceback line(s) of another node's summary", stacks.rejected);
      }
      attempt_.remote_stacks.merge(stacks.ranks);  // two nodes claim one rank: the first answer holds
    }
  }
  const auto verdict = hangVerdict(positions);
  if (!verdict) {
    // Python workers before their first collective have no ring yet: their stacks judge.
    log_->log(positions.empty() && config_.python_workers ? spdlog::level::debug : spdlog::level::warn,
              "{}; the flight recorder shows no operation pending on this node", trigger);
    return {};
  }
  log_->error("{}; {}", trigger, verdict->text);
  recordVerdict(trigger, verdict->text, nullptr, verdict->culprits);
  for (int rank : verdict->culprits) addRemoteCulprit(rank, verdict->text);
  return verdict->text;
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

void HangWatch::addRemoteCulprit(int rank, const std::string& verdict) {
  for (const Worker& w : group_.workers()) {
    if (w.place.rank == rank) return;  // this node's own
  }
  for (const WorkerFailure& f : attempt_.remote_culprits) {
    if (f.rank == rank) return;
  }
  // Only a rank whose node answered with its frames: that node is known, and so is its place.
  auto it = attempt_.remote_stacks.find(rank);
  if (it == attempt_.remote_stacks.end()) return;
  WorkerFailure f = remoteFailure(rank, it->second.node, it->second.local_rank, it->second.traceback, verdict,
                                  "blamed by the flight recorder rings");
  f.time = std::chrono::system_clock::now();
  attempt_.remote_culprits.push_back(std::move(f));
}

}  // namespace ddprun::agent
