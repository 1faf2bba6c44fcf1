#include "agent/ops/failure_report.h"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <ctime>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ddprun::agent {
namespace {

double secondsSinceEpoch(std::chrono::system_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

// The error file's timestamp has one-second resolution; an exit seen within that
// second still counts as after the error was written.
double causeTime(const WorkerFailure& f) {
  if (f.error && f.error->timestamp) return *f.error->timestamp;
  return secondsSinceEpoch(f.time);
}

std::string formatTime(std::chrono::system_clock::time_point t) {
  std::time_t secs = std::chrono::system_clock::to_time_t(t);
  auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() % 1000;
  std::tm tm{};
  ::localtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  char zone[16];
  std::strftime(zone, sizeof zone, "%Z", &tm);
  return fmt::format("{}.{:03d} {}", buf, millis, zone);
}

std::string indent(std::string_view text, std::string_view pad) {
  std::string out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    out += pad;
    out += text.substr(start, end - start);
    out += '\n';
    start = end + 1;
  }
  return out;
}

// A field's value of several lines (torch 2.x raises such messages): the lines after the first
// start under the first, so the value does not spill out of the report's layout.
std::string continued(std::string_view text, std::string_view pad) {
  std::string out;
  size_t start = 0;
  while (true) {
    const size_t end = text.find('\n', start);
    const std::string_view line = text.substr(start, end == std::string_view::npos ? end : end - start);
    if (start > 0 && !line.empty()) out += pad;
    out += line;
    if (end == std::string_view::npos) return out;
    out += '\n';
    start = end + 1;
  }
}

// Why ddprun stopped a hung worker and where it stood: the first lines of its stacks.
void appendHang(std::string& out, const WorkerFailure& f) {
  out +=
      fmt::format("  hung      : {}; ddprun took its stacks, then stopped it{}\n", f.hang_reason,
                  f.hang_python_abort ? " (SIGABRT first: Python printed every thread's traceback to its stderr)" : "");
  std::vector<std::string_view> lines;
  for (size_t start = 0; start < f.stacks.size();) {
    size_t end = f.stacks.find('\n', start);
    if (end == std::string::npos) end = f.stacks.size();
    lines.push_back(std::string_view(f.stacks).substr(start, end - start));
    start = end + 1;
  }
  std::vector<std::string> notes;
  if (!f.stacks_tool.empty()) notes.push_back("native, by " + f.stacks_tool);
  if (!f.stacks_note.empty()) notes.push_back(f.stacks_note);
  if (lines.size() > kReportStackLines) {
    notes.push_back(fmt::format("first {} of {} lines", kReportStackLines, lines.size()));
  }
  if (!f.stacks_file.empty()) notes.push_back("all of them in " + f.stacks_file);
  out += fmt::format("  stacks    : ({})\n", fmt::join(notes, "; "));
  for (size_t i = 0; i < lines.size() && i < kReportStackLines; ++i) out += fmt::format("    {}\n", lines[i]);
}

void appendFailure(std::string& out, const WorkerFailure& f) {
  out += fmt::format("  rank      : {} (local_rank: {})\n", f.rank, f.local_rank);
  out += fmt::format("  host      : {}\n", f.host);
  if (!f.elsewhere.empty()) {
    // Blamed by this node's verdict, it runs on another node, whose agent stops it.
    out += "  exit      : (a rank of another node; its agent stops it as the round ends)\n";
    out += fmt::format("  where     : {}\n", f.elsewhere);
    out += fmt::format("  verdict   : {}\n", continued(f.hang_reason, "              "));
    if (!f.python_stack.empty()) {
      out += "  python    : (its main thread, taken by its node's agent before anyone was stopped)\n";
      out += indent(f.python_stack, "    ");
    }
    return;
  }
  out += fmt::format("  pid       : {}\n", f.pid);
  if (f.signal != 0) {
    out += fmt::format("  exit      : killed by {} ({})\n", signalName(f.signal), f.signal);
  } else {
    out += fmt::format("  exit      : exit code {}\n", f.exit_code);
  }
  out += fmt::format("  time      : {}\n", formatTime(f.time));
  if (!f.gpu_fault.empty()) out += fmt::format("  gpu fault : {}\n", f.gpu_fault);
  if (!f.hang_reason.empty()) appendHang(out, f);
  if (!f.python_stack.empty()) {
    out += fmt::format("  python    : (its main thread, taken before the stop{})\n",
                       f.python_stack_file.empty() ? "" : "; every thread in " + f.python_stack_file);
    out += indent(f.python_stack, "    ");
  }
  if (!f.error && !f.python_exception.empty()) {
    out += "  message   : (the worker wrote no error file; its uncaught exception, saved by ddprun's Python hook)\n";
    out += "  traceback :\n";
    out += indent(f.python_exception, "    ");
  } else if (f.error) {
    out += fmt::format("  error_file: {}\n", f.error_file);
    out += fmt::format("  message   : {}\n", continued(f.error->message, "              "));
    if (!f.error->traceback.empty()) {
      out += "  traceback :\n";
      out += indent(f.error->traceback, "    ");
    }
  } else if (f.stderr_tail.empty()) {
    out += "  message   : (the worker wrote no error file; see its stderr)\n";
  } else {
    out += "  message   : (the worker wrote no error file; the end of its stderr follows)\n";
  }
  const bool said = f.error || !f.python_exception.empty();
  if (!f.stderr_tail.empty() && (!said || !f.stderr_file_error.empty())) {
    const size_t lines = static_cast<size_t>(std::count(f.stderr_tail.begin(), f.stderr_tail.end(), '\n'));
    std::string where;
    if (!f.stderr_file_error.empty()) {
      where = fmt::format("; {} is incomplete: {}", f.stderr_file, f.stderr_file_error);
    } else if (!f.stderr_file.empty()) {
      where = fmt::format("; all of it in {}", f.stderr_file);
    }
    out += fmt::format("  stderr    : (last {} line{}{})\n", lines, lines == 1 ? "" : "s", where);
    out += indent(f.stderr_tail, "    ");
  }
}

}  // namespace

std::string signalName(int signal) {
  if (const char* abbrev = ::sigabbrev_np(signal)) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(signal);
}

void sortRootCauseFirst(std::vector<WorkerFailure>& failures) {
  std::stable_sort(failures.begin(), failures.end(), [](const WorkerFailure& a, const WorkerFailure& b) {
    double ta = causeTime(a), tb = causeTime(b);
    if (ta != tb) return ta < tb;
    if (a.time != b.time) return a.time < b.time;
    return a.rank < b.rank;
  });
}

void putRanksFirst(std::vector<WorkerFailure>& failures, const std::vector<int>& ranks) {
  std::stable_partition(failures.begin(), failures.end(), [&](const WorkerFailure& f) {
    return std::find(ranks.begin(), ranks.end(), f.rank) != ranks.end();
  });
}

std::string formatFailureReport(std::string_view entry_name, const std::vector<WorkerFailure>& failures) {
  const std::string rule(64, '=');
  const std::string thin(64, '-');
  std::string out = rule + "\n";
  out += fmt::format("{} FAILED: {} worker{} failed\n", entry_name, failures.size(), failures.size() == 1 ? "" : "s");
  out += thin + "\nRoot cause (first failure):\n";
  appendFailure(out, failures.front());
  if (failures.size() > 1) {
    out += thin + "\nOther failures:\n";
    for (size_t i = 1; i < failures.size(); ++i) {
      if (i > 1) out += "\n";
      appendFailure(out, failures[i]);
    }
  }
  out += rule + "\n";
  return out;
}

}  // namespace ddprun::agent
