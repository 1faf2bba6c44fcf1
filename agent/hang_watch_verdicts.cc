// The hang watch's verdicts (hang_watch.h): the Python stacks it takes, what says that a
// collective failed, and the three verdicts (the flight recorder rings with the other nodes'
// summaries, torch's dumps, the Python frames). Apart from hang_watch.cc, which watches and
// stops, so that each file stays short.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "agent/hang/python/live_traces.h"
#include "agent/hang/python/python_hook.h"
#include "agent/hang/python/python_stacks.h"
#include "agent/hang/python/stack_summary.h"
#include "agent/hang/python/worker_server_stacks.h"
#include "agent/hang_watch.h"
#include "agent/ops/error_file.h"
#include "agent/torch_trace/dump_summary.h"
#include "agent/torch_trace/dump_verdict.h"
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

std::string HangWatch::collectiveFailureTrigger(const std::vector<WorkerFailure>& failures, bool& maybe) const {
  maybe = false;
  if (!attempt_.collective_line.empty()) return "a collective failed (" + attempt_.collective_line + ")";
  const std::vector<Worker>& workers = group_.workers();
  for (const WorkerFailure& f : failures) {
    if (!f.hang_reason.empty()) continue;
    if (f.error && reportsCollectiveTimeout(f.error->message)) {
      return fmt::format("rank {} failed: a collective timed out", f.rank);
    }
    std::string said = f.python_exception;
    for (const Worker& w : workers) {
      if (w.pid == f.pid && w.stderr_record) said += "\n" + w.stderr_record->tail.text();
    }
    if (auto line = collectiveFailureIn(said)) {
      return fmt::format("rank {} failed: a collective failed ({})", f.rank, printable(*line));
    }
  }
  const std::optional<int> dumped = attempt_.torch_dumps ? attempt_.torch_dumps->written() : std::nullopt;
  // NCCL's watchdog aborts the process from a C++ thread: no error file, no exception, and
  // its words on stderr reach ddprun only when stderr goes through it.
  for (const WorkerFailure& f : failures) {
    if (!f.hang_reason.empty() || f.signal != SIGABRT || f.error || !f.python_exception.empty()) continue;
    for (const Worker& w : workers) {
      if (w.pid == f.pid && (w.python_hook || !w.torch_dump.empty())) {
        maybe = !dumped;  // a dump ties it to a collective
        return fmt::format("rank {} was killed by SIGABRT and wrote no error file, as torch's NCCL watchdog does",
                           f.rank);
      }
    }
  }
  if (dumped) return fmt::format("rank {} wrote torch's flight-recorder dump", *dumped);
  return {};
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

namespace {

// Where the verdict found `rank`, as its rank line says it: "behind, last called all_reduce
// #1 (completed) at /job/train.py:12 in main".
std::string standingOf(const DumpVerdict& verdict, int rank) {
  for (const GroupFinding& f : verdict.findings) {
    if (std::find(f.culprits.begin(), f.culprits.end(), rank) == f.culprits.end()) continue;
    for (const RankStand& r : f.ranks) {
      if (r.rank != rank) continue;
      const bool inside = r.doing.rfind("in ", 0) == 0;
      std::string out = rankStandingName(r.standing);
      if (!r.doing.empty()) out += (inside ? " " : ", ") + r.doing;
      if (r.call_site) {
        out += fmt::format("{}{}:{}", inside ? ", called at " : " at ", printable(r.call_site->filename),
                           r.call_site->line);
        if (!r.call_site->name.empty()) out += " in " + printable(r.call_site->name);
      }
      return out;
    }
  }
  return "blamed by the flight-recorder dumps";
}

}  // namespace

std::string HangWatch::judgeTorchDumps(const std::string& trigger) {
  if (!attempt_.torch_dumps && attempt_.live_traces.empty()) return {};
  std::vector<int> local_ranks;
  for (const Worker& w : group_.workers()) local_ranks.push_back(w.place.rank);
  // The dump files are waited for (once already, before the other nodes were asked) only for
  // ranks without a live trace.
  const bool all_live = tracesCover(attempt_.live_traces, local_ranks);
  std::chrono::milliseconds waited{0};
  if (attempt_.torch_dumps && !all_live) waited = attempt_.dumps_waited ? *attempt_.dumps_waited : settleTorchDumps();
  const auto waited_ms = waited.count();
  NodeDumps local = nodeDumps(attempt_.torch_dumps.get(), attempt_.live_traces, local_ranks);
  const std::vector<int>& missing = local.missing;
  if (local.dumps.empty() && local.unreadable.empty()) {
    log_->info("no torch flight-recorder dump from rank {} within {} ms; the verdict comes from the Python stacks",
               rankRanges(missing), waited_ms);
    return {};
  }
  std::string gaps;
  if (!missing.empty()) {
    gaps = fmt::format("no dump from rank {} within {} ms", rankRanges(missing), waited_ms);
  }
  for (const std::string& line : local.unreadable) {
    gaps += (gaps.empty() ? "" : "; ") + printable(line);
  }
  if (!gaps.empty()) {
    log_->warn("torch flight-recorder dumps: {}; the verdict comes from the Python stacks", gaps);
    return {};
  }
  DumpVerdictOptions options;
  // The files' time, or now for live traces (taken moments ago).
  const int64_t newest = attempt_.torch_dumps ? attempt_.torch_dumps->newestNs() : 0;
  if (local.live > 0) {
    options.now_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
  } else if (newest > 0) {
    options.now_ns = newest;
  }
  for (const Worker& w : group_.workers()) {
    if (!w.running && w.exit_code == 0 && w.signal == 0) options.finished_ranks.push_back(w.place.rank);
  }
  std::vector<int> read_ranks;
  for (const FlightDump& d : local.dumps) read_ranks.push_back(d.rank);
  std::sort(read_ranks.begin(), read_ranks.end());
  std::vector<FlightDump> dumps = std::move(local.dumps);
  // The other nodes' ranks, from their summaries.
  std::map<int, RemoteRank> remote;
  std::map<int, std::string> remote_stacks;
  const auto& current = reporter_.round();
  if (current && static_cast<size_t>(current->world_size) > group_.workers().size()) {
    for (const std::string& answer : otherNodes()) {
      // Every Python rank's frames come in the answer, with a dump or without: when a dump is
      // missing, the Python stacks' verdict (judgePythonHang) needs them. Only the ring
      // verdict kept them before, so that verdict named the rank or not by which ran first.
      attempt_.remote_stacks.merge(decodeStackSummary(answer, current->world_size, local_ranks).ranks);
      RemoteDumps theirs = decodeDumpSummary(answer, current->world_size, local_ranks);
      if (theirs.rejected > 0) {
        log_->warn(
            "torch flight-recorder dumps: ignored {} line(s) of another node's summary that this job of {} "
            "ranks cannot hold",
            theirs.rejected, current->world_size);
      }
      for (FlightDump& d : theirs.dumps) {
        if (remote.count(d.rank)) continue;  // two nodes claim one rank: the first answer holds
        remote[d.rank] = theirs.ranks[d.rank];
        if (auto stack = theirs.python_stacks.find(d.rank); stack != theirs.python_stacks.end()) {
          remote_stacks[d.rank] = stack->second;
        }
        dumps.push_back(std::move(d));
      }
      options.finished_ranks.insert(options.finished_ranks.end(), theirs.finished_ranks.begin(),
                                    theirs.finished_ranks.end());
    }
    std::vector<int> without;
    for (int r = 0; r < current->world_size; ++r) {
      if (!remote.count(r) && std::find(local_ranks.begin(), local_ranks.end(), r) == local_ranks.end()) {
        without.push_back(r);
      }
    }
    if (!without.empty()) {
      log_->warn(
          "torch flight-recorder dumps: no dump of rank {} came from the other nodes (this node read rank {}); the "
          "verdict comes from the Python stacks",
          rankRanges(without), rankRanges(read_ranks));
      return {};
    }
  }
  const DumpVerdict verdict = dumpVerdict(dumps, options);
  std::string text = verdict.text();
  while (!text.empty() && text.back() == '\n') text.pop_back();
  if (verdict.culprits.empty()) {
    log_->warn("{}; the flight-recorder dumps name no rank behind: {}", trigger, printable(text));
    return {};
  }
  log_->error("{}; {}", trigger, text);
  recordVerdict(trigger, text, "flight_recorder", verdict.culprits);
  // One line for the report: the findings' sentences (the last one names the root cause when
  // there are several).
  std::string sentences;
  for (const GroupFinding& f : verdict.findings) sentences += (sentences.empty() ? "" : "; ") + f.line;
  if (verdict.findings.size() > 1) sentences += "; root cause rank " + rankRanges(verdict.culprits);
  for (int rank : verdict.culprits) {
    auto it = remote.find(rank);
    if (it == remote.end()) continue;
    WorkerFailure f;
    f.rank = rank;
    f.local_rank = it->second.local_rank;
    f.host = it->second.node.empty() ? "another node" : printable(it->second.node);
    f.time = std::chrono::system_clock::now();
    f.hang_reason = sentences;
    f.elsewhere = standingOf(verdict, rank);
    // Its traceback as its node took it before anyone was stopped (a worker's text: shown escaped).
    if (auto stack = remote_stacks.find(rank); stack != remote_stacks.end()) {
      for (std::string_view rest = stack->second; !rest.empty();) {
        const size_t newline = rest.find('\n');
        f.python_stack += printable(rest.substr(0, newline)) + "\n";
        rest = newline == std::string_view::npos ? std::string_view{} : rest.substr(newline + 1);
      }
    }
    attempt_.remote_culprits.push_back(std::move(f));
  }
  return sentences;
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
  WorkerFailure f;
  f.rank = rank;
  f.local_rank = it->second.local_rank;
  f.host = it->second.node.empty() ? "another node" : printable(it->second.node);
  f.time = std::chrono::system_clock::now();
  f.hang_reason = verdict;
  f.elsewhere = "blamed by the flight recorder rings";
  // A worker's text: shown escaped, a line at a time.
  for (std::string_view rest = it->second.traceback; !rest.empty();) {
    const size_t newline = rest.find('\n');
    f.python_stack += printable(rest.substr(0, newline)) + "\n";
    rest = newline == std::string_view::npos ? std::string_view{} : rest.substr(newline + 1);
  }
  attempt_.remote_culprits.push_back(std::move(f));
}

}  // namespace ddprun::agent
