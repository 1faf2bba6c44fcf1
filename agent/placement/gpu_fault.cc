#include "agent/placement/gpu_fault.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace ddprun::agent {
namespace {

constexpr size_t kMaxLine = 300;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

struct Pattern {
  const char* text;
  const char* kind;
  const char* what;
  bool hardware;
};

// The hardware faults first: a line may name two (NCCL's "unhandled cuda error ... an
// illegal memory access" after an ECC error names only its own).
constexpr Pattern kPatterns[] = {
    {"uncorrectable ECC error encountered", "uncorrectable_ecc", "uncorrectable ECC error", true},
    {"GPU has fallen off the bus", "fell_off_bus", "GPU fell off the bus", true},
    {"an illegal memory access was encountered", "illegal_memory_access", "illegal memory access", false},
    {"unspecified launch failure", "launch_failure", "unspecified launch failure", false},
    {"device-side assert triggered", "device_assert", "device-side assert", false},
};

// "0000:3b:00" or "0000:3b:00.0" (hex); the rest of the text after it is ignored.
bool parsePci(std::string_view text, KernelGpuEvent& out) {
  unsigned parts[3] = {};
  for (int i = 0; i < 3; ++i) {
    const char* begin = text.data();
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(begin, end, parts[i], 16);
    if (ec != std::errc() || ptr == begin) return false;
    text.remove_prefix(static_cast<size_t>(ptr - begin));
    if (i < 2) {
      if (text.empty() || text.front() != ':') return false;
      text.remove_prefix(1);
    }
  }
  out.domain = parts[0];
  out.bus = parts[1];
  out.device = parts[2];
  return true;
}

std::string clip(std::string_view line) { return std::string(trim(line).substr(0, kMaxLine)); }

}  // namespace

std::optional<CudaFault> cudaFaultIn(std::string_view text) {
  // The last line that names one: a traceback's source lines come before its exception's.
  std::optional<CudaFault> found;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    for (const Pattern& p : kPatterns) {
      if (contains(line, p.text)) {
        found = CudaFault{p.kind, p.what, p.hardware, clip(line)};
        break;
      }
    }
    start = end + 1;
  }
  return found;
}

std::optional<KernelGpuEvent> nvrmEventIn(std::string_view message) {
  const size_t nvrm = message.find("NVRM: ");
  if (nvrm == std::string_view::npos) return std::nullopt;
  std::string_view rest = message.substr(nvrm + 6);
  KernelGpuEvent event;
  if (rest.substr(0, 5) == "Xid (") {
    rest.remove_prefix(5);
    if (rest.substr(0, 4) == "PCI:") rest.remove_prefix(4);
    if (!parsePci(rest, event)) return std::nullopt;
    const size_t close = rest.find("): ");
    if (close == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(close + 3);
    int xid = 0;
    const auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), xid);
    if (ec != std::errc() || ptr == rest.data() || xid < 0) return std::nullopt;
    event.xid = xid;
    event.kind = "xid";
  } else if (contains(rest, "fallen off the bus")) {
    // "GPU 0000:3b:00.0: GPU has fallen off the bus."
    const size_t gpu = rest.find("GPU ");
    if (gpu == std::string_view::npos || !parsePci(rest.substr(gpu + 4), event)) return std::nullopt;
    event.kind = "fell_off_bus";
  } else {
    return std::nullopt;
  }
  event.line = clip(message.substr(nvrm));
  return event;
}

std::string xidMeaning(int xid) {
  switch (xid) {
    case 13: return "graphics engine exception (often the program: an out-of-range access)";
    case 31: return "GPU memory page fault (often the program: an illegal address)";
    case 43: return "the GPU stopped processing (a program's fault)";
    case 45: return "preemptive cleanup after an earlier error";
    case 48: return "double-bit ECC error";
    case 61:
    case 62: return "internal micro-controller error";
    case 63: return "ECC page retirement or row remapping recorded";
    case 64: return "ECC page retirement or row remapping failed";
    case 74: return "NVLink error";
    case 79: return "the GPU fell off the bus";
    case 92: return "high single-bit ECC error rate";
    case 94: return "contained ECC error";
    case 95: return "uncontained ECC error";
    case 119:
    case 120: return "GSP error";
    default: return {};
  }
}

KernelLog::KernelLog(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd) {
    problem_ = path + ": " + std::strerror(errno);
    return;
  }
  // /dev/kmsg starts at the oldest record it keeps; only what comes from now on is ours.
  if (::lseek(fd.get(), 0, SEEK_END) < 0) {
    problem_ = path + ": cannot seek to its end: " + std::strerror(errno);
    return;
  }
  fd_ = std::move(fd);
}

std::vector<std::string> KernelLog::readNew(size_t max_bytes) {
  std::vector<std::string> messages;
  if (!fd_) return messages;
  // /dev/kmsg gives one record per read, and EINVAL to a buffer smaller than a record.
  char buf[8192];
  std::string text = std::move(partial_);
  partial_.clear();
  for (size_t total = 0; total < max_bytes;) {
    const ssize_t n = ::read(fd_.get(), buf, sizeof buf);
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
      total += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    // Records overwritten before we read them: the next read goes on with the oldest kept.
    if (n < 0 && errno == EPIPE) continue;
    break;  // 0 (a file's end), EAGAIN (no more records), or an error: what was read stands
  }
  size_t start = 0;
  for (;;) {
    const size_t end = text.find('\n', start);
    if (end == std::string::npos) {
      partial_ = text.substr(start);
      break;
    }
    std::string_view line(text.data() + start, end - start);
    start = end + 1;
    // Continuation lines (" SUBSYSTEM=pci") carry the record's dictionary, not its message.
    if (line.empty() || line.front() == ' ') continue;
    // "6,1234,5678901,-;message": the header is digits and commas before the first ';'.
    const size_t semi = line.find(';');
    if (semi != std::string_view::npos &&
        line.substr(0, semi).find_first_not_of("0123456789,-+c") == std::string_view::npos) {
      line.remove_prefix(semi + 1);
    }
    messages.emplace_back(line);
  }
  return messages;
}

}  // namespace ddprun::agent
