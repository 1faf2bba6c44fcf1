#include "agent/hang/python/python_stacks.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "common/worker_file.h"

namespace ddprun::agent {
namespace {

constexpr size_t kMaxLine = 300;
// The most of a source file read for one line of it.
constexpr size_t kMaxSourceBytes = size_t{4} << 20;

std::vector<std::string_view> splitLines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// A line without the "[rank0]:" that --tee and --local_ranks_filter put before it.
std::string_view withoutRankPrefix(std::string_view line) {
  if (line.substr(0, 5) == "[rank") {
    const size_t close = line.find("]:");
    if (close != std::string_view::npos) line.remove_prefix(close + 2);
  }
  return line;
}

// `File "path", line 12, in f` (a traceback) or `File "path", line 12 in f` (faulthandler).
std::optional<PyFrame> parseFrame(std::string_view line) {
  const size_t at = line.find("File \"");
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = line.substr(at + 6);
  const size_t quote = rest.find("\", line ");
  if (quote == std::string_view::npos) return std::nullopt;
  PyFrame frame;
  frame.file = std::string(rest.substr(0, quote));
  rest.remove_prefix(quote + 8);
  size_t digits = 0;
  while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9') ++digits;
  if (digits == 0 || digits > 9) return std::nullopt;
  frame.line = std::stoi(std::string(rest.substr(0, digits)));
  rest.remove_prefix(digits);
  if (rest.substr(0, 5) == ", in ") {
    rest.remove_prefix(5);
  } else if (rest.substr(0, 4) == " in ") {
    rest.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  frame.function = std::string(trim(rest));
  return frame;
}

// torch.distributed's collectives and their helpers; not torch.distributed.elastic, whose
// @record wrapper and timers sit around the user's code.
bool inTorchDistributed(const PyFrame& f) {
  return contains(f.file, "torch/distributed/") && !contains(f.file, "torch/distributed/elastic/");
}

// ddprun's own frame between the user's call and torch's (the hook's recording wrapper,
// agent/hang/python/_ddprun_progress.py): left out, so that frames read as without ddprun.
bool isHookFrame(const PyFrame& f) { return f.file.ends_with("/_ddprun_progress.py"); }

std::vector<PyFrame> withoutHookFrames(std::vector<PyFrame> frames) {
  std::erase_if(frames, isHookFrame);
  return frames;
}

std::string rankList(const std::vector<int>& ranks) {
  return fmt::format("rank{} {}", ranks.size() == 1 ? "" : "s", rankRanges(ranks));
}

}  // namespace

std::optional<std::string> collectiveFailureIn(std::string_view text) {
  for (std::string_view line : splitLines(text)) {
    const bool gloo_timeout = contains(line, "Timed out waiting") && contains(line, "operation to complete");
    if (gloo_timeout || contains(line, "Watchdog caught collective operation timeout") ||
        contains(line, "Process group watchdog thread terminated with exception") ||
        contains(line, "Some NCCL operations have failed or timed out") ||
        contains(line, "NCCL communicator was aborted") || contains(line, "NCCL error in:")) {
      std::string out(trim(line).substr(0, kMaxLine));
      return out;
    }
  }
  return std::nullopt;
}

std::vector<PyFrame> mainThreadFrames(std::string_view dump) {
  struct Thread {
    bool current = false;
    std::vector<PyFrame> frames;  // innermost first, as faulthandler prints them
  };
  std::vector<Thread> threads;
  for (std::string_view raw : splitLines(dump)) {
    std::string_view line = withoutRankPrefix(raw);
    if (contains(line, "hread 0x") && contains(line, "(most recent call first)")) {
      threads.push_back(Thread{trim(line).substr(0, 7) == "Current", {}});
      continue;
    }
    if (threads.empty()) continue;
    if (auto frame = parseFrame(line)) threads.back().frames.push_back(std::move(*frame));
  }
  const Thread* main = nullptr;
  for (const Thread& t : threads) {
    if (t.frames.empty() || t.frames.back().function != "<module>") continue;
    if (main == nullptr || t.current) main = &t;
  }
  for (const Thread& t : threads) {
    if (main == nullptr && t.current) main = &t;
  }
  if (main == nullptr && !threads.empty()) main = &threads.front();
  if (main == nullptr) return {};
  return withoutHookFrames(std::vector<PyFrame>(main->frames.rbegin(), main->frames.rend()));
}

std::vector<PyFrame> lastTraceback(std::string_view text) {
  const std::vector<std::string_view> lines = splitLines(text);
  size_t start = lines.size();
  for (size_t i = lines.size(); i-- > 0;) {
    if (contains(lines[i], "Traceback (most recent call last):")) {
      start = i + 1;
      break;
    }
  }
  std::vector<PyFrame> frames;
  for (size_t i = start; i < lines.size(); ++i) {
    const std::string_view line = withoutRankPrefix(lines[i]);
    if (line.empty() || (line.front() != ' ' && line.front() != '\t')) break;
    if (auto frame = parseFrame(line)) frames.push_back(std::move(*frame));
  }
  return withoutHookFrames(std::move(frames));
}

std::optional<CollectiveCall> collectiveCallOf(const std::vector<PyFrame>& frames) {
  size_t first = frames.size();
  for (size_t i = 0; i < frames.size(); ++i) {
    if (inTorchDistributed(frames[i])) {
      first = i;
      break;
    }
  }
  if (first == frames.size()) return std::nullopt;
  auto isApi = [](const PyFrame& f, bool c10d_only) {
    if (!inTorchDistributed(f) || f.function == "wrapper" || f.function == "<lambda>") return false;
    return !c10d_only || contains(f.file, "distributed_c10d.py");
  };
  const PyFrame* api = nullptr;
  for (bool c10d_only : {true, false}) {
    for (size_t i = first; i < frames.size() && api == nullptr; ++i) {
      if (isApi(frames[i], c10d_only)) api = &frames[i];
    }
    if (api != nullptr) break;
  }
  if (api == nullptr) api = &frames[first];
  return CollectiveCall{api->function, frames[first == 0 ? 0 : first - 1]};
}

std::string describeFrame(const PyFrame& frame, std::string_view source) {
  std::string out = fmt::format("{}:{} in {}", frame.file, frame.line, frame.function);
  if (!source.empty()) out += fmt::format(": {}", source);
  return out;
}

std::optional<HangVerdict> pythonHangVerdict(const std::vector<RankFrames>& ranks,
                                             std::string (*source_of)(const PyFrame&)) {
  auto describe = [&](const PyFrame& f) { return describeFrame(f, source_of ? source_of(f) : std::string()); };
  std::vector<std::pair<const RankFrames*, CollectiveCall>> in_call;
  std::vector<const RankFrames*> outside;
  for (const RankFrames& r : ranks) {
    if (r.frames.empty()) continue;  // nothing known of it
    if (auto call = collectiveCallOf(r.frames)) {
      in_call.emplace_back(&r, std::move(*call));
    } else {
      outside.push_back(&r);
    }
  }
  if (in_call.empty()) return std::nullopt;
  std::sort(in_call.begin(), in_call.end(), [](const auto& a, const auto& b) { return a.first->rank < b.first->rank; });
  std::sort(outside.begin(), outside.end(), [](const auto* a, const auto* b) { return a->rank < b->rank; });
  // The others' call: the one most ranks are in; a tie goes to the lowest rank's.
  std::map<std::string, int> count;
  for (const auto& [r, call] : in_call) ++count[call.op];
  std::string common = in_call.front().second.op;
  for (const auto& [r, call] : in_call) {
    if (count[call.op] > count[common]) common = call.op;
  }
  std::vector<int> waiting;
  const CollectiveCall* waiting_call = nullptr;
  std::vector<std::string> clauses;
  std::vector<int> behind;
  std::vector<int> mismatched;
  for (const auto& [r, call] : in_call) {
    if (call.op == common) {
      waiting.push_back(r->rank);
      if (waiting_call == nullptr) waiting_call = &call;
    }
  }
  for (const RankFrames* r : outside) {
    behind.push_back(r->rank);
    clauses.push_back(fmt::format("rank {} {} not in a collective, at {}", r->rank, r->failed ? "was" : "is",
                                  describe(r->frames.back())));
  }
  for (const auto& [r, call] : in_call) {
    if (call.op == common) continue;
    mismatched.push_back(r->rank);
    clauses.push_back(fmt::format("rank {} called {} at {}", r->rank, call.op, describe(call.site)));
  }
  if (clauses.empty()) return std::nullopt;
  std::string text = "hang: ";
  for (const std::string& c : clauses) text += c + "; ";
  text += fmt::format("{} {} in {} (called at {})", rankList(waiting), waiting.size() == 1 ? "waits" : "wait", common,
                      describe(waiting_call->site));
  if (!behind.empty()) {
    text += fmt::format(" — {} {} behind", rankList(behind), behind.size() == 1 ? "is" : "are");
  }
  if (!mismatched.empty()) {
    text += fmt::format("{}{} called something else", behind.empty() ? " — " : ", ", rankList(mismatched));
  }
  HangVerdict verdict;
  verdict.text = std::move(text);
  verdict.culprits = behind;
  verdict.culprits.insert(verdict.culprits.end(), mismatched.begin(), mismatched.end());
  std::sort(verdict.culprits.begin(), verdict.culprits.end());
  return verdict;
}

std::string sourceLine(const PyFrame& frame) {
  if (frame.line <= 0 || frame.file.empty() || frame.file.front() == '<') return {};
  // The path comes from a worker's traceback: it may name a FIFO or a device. Links are
  // followed (installed and built sources are often links), but only to a regular file.
  const WorkerFile source = readWorkerFile(frame.file, kMaxSourceBytes, WorkerFileLinks::kFollow);
  const std::vector<std::string_view> lines = splitLines(source.bytes);
  // A line cut by the bound is not the source line.
  const size_t whole = source.cut && !lines.empty() ? lines.size() - 1 : lines.size();
  if (static_cast<size_t>(frame.line) > whole) return {};
  return std::string(trim(lines[static_cast<size_t>(frame.line) - 1]).substr(0, kMaxLine));
}

std::string formatTraceback(const std::vector<PyFrame>& frames) {
  std::string out;
  for (const PyFrame& frame : frames) {
    out += fmt::format("File \"{}\", line {}, in {}\n", frame.file, frame.line, frame.function);
    if (std::string source = sourceLine(frame); !source.empty()) out += "  " + source + "\n";
  }
  return out;
}

}  // namespace ddprun::agent
