#include "agent/placement/cpu_topology.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "common/env_names.h"
#include "common/env_reader.h"
#include "common/error.h"

namespace ddprun::agent {
namespace fs = std::filesystem;
namespace {

// sysfs attributes are a page at most (a list of 8192 CPUs fits); more is not sysfs.
constexpr size_t kMaxFileBytes = 64 * 1024;

std::string readSysfsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw SystemError("read " + path, errno ? errno : ENOENT);
  std::string text(kMaxFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxFileBytes) throw DdprunError(path + ": more than " + std::to_string(kMaxFileBytes) + " bytes");
  return text;
}

std::string_view trimSysfs(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

std::optional<int> parseNonNegative(std::string_view s) {
  s = trimSysfs(s);
  int value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < 0) return std::nullopt;
  return value;
}

int readInt(const std::string& path) {
  const std::string text = readSysfsFile(path);
  std::string_view s = trimSysfs(text);
  int value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size()) {
    throw DdprunError(path + ": expected an integer, found '" + std::string(s) + "'");
  }
  return value;
}

struct CpuRange {
  int first = 0;
  int last = 0;
};

// The list's ranges as written, not expanded; nothing when malformed.
std::optional<std::vector<CpuRange>> parseCpuRanges(std::string_view text) {
  std::vector<CpuRange> ranges;
  text = trimSysfs(text);
  while (!text.empty()) {
    auto comma = text.find(',');
    std::string_view item = trimSysfs(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    if (item.empty()) continue;
    auto dash = item.find('-');
    auto first = parseNonNegative(item.substr(0, dash));
    auto last = dash == std::string_view::npos ? first : parseNonNegative(item.substr(dash + 1));
    if (!first || !last || *last < *first) return std::nullopt;
    ranges.push_back({*first, *last});
  }
  return ranges;
}

// The highest CPU of a list's ranges; -1 for none.
int highestCpu(const std::vector<CpuRange>& ranges) {
  int highest = -1;
  for (const CpuRange& r : ranges) highest = std::max(highest, r.last);
  return highest;
}

std::string shown(std::string_view text) {
  text = trimSysfs(text);
  return text.size() <= 64 ? std::string(text) : std::string(text.substr(0, 64)) + "...";
}

}  // namespace

std::optional<CpuSet> parseCpuList(std::string_view text, int cpu_limit) {
  const auto ranges = parseCpuRanges(text);
  if (!ranges || highestCpu(*ranges) >= cpu_limit) return std::nullopt;
  CpuSet cpus;
  for (const CpuRange& r : *ranges) {
    for (int cpu = r.first; cpu <= r.last; ++cpu) cpus.insert(cpu);
  }
  return cpus;
}

std::string formatCpuList(const CpuSet& cpus) {
  std::string text;
  for (auto it = cpus.begin(); it != cpus.end();) {
    int first = *it, last = *it;
    for (++it; it != cpus.end() && *it == last + 1; ++it) last = *it;
    if (!text.empty()) text += ',';
    text += std::to_string(first);
    if (last != first) text += '-' + std::to_string(last);
  }
  return text;
}

CpuTopology::CpuTopology(std::string root) : root_(root == "/" ? "" : std::move(root)) {
  while (!root_.empty() && root_.back() == '/') root_.pop_back();
}

CpuTopology CpuTopology::fromEnvironment() { return CpuTopology(env::stringOr(env::kTopologyRoot, "")); }

std::string CpuTopology::path(const std::string& relative) const { return root_ + "/" + relative; }

int CpuTopology::cpuLimit() {
  if (cpu_limit_) return *cpu_limit_;
  const std::string file = path("sys/devices/system/cpu/possible");
  std::error_code ec;
  int limit = kMaxCpus;
  if (fs::exists(file, ec)) {
    const std::string text = readSysfsFile(file);
    const auto ranges = parseCpuRanges(text);
    if (!ranges || ranges->empty() || highestCpu(*ranges) >= kMaxCpus) {
      throw DdprunError(file + ": '" + shown(text) + "' is not a list of at most " + std::to_string(kMaxCpus) +
                        " CPUs");
    }
    limit = highestCpu(*ranges) + 1;
  }
  cpu_limit_ = limit;
  return limit;
}

CpuSet CpuTopology::readCpuList(const std::string& file) {
  const std::string text = readSysfsFile(file);
  const auto ranges = parseCpuRanges(text);
  if (!ranges) throw DdprunError(file + ": '" + shown(text) + "' is not a CPU list");
  const int limit = cpuLimit();
  if (highestCpu(*ranges) >= limit) {
    throw DdprunError(fmt::format("{}: '{}' names CPU {}, but this machine has at most {} CPUs (0-{})", file,
                                  shown(text), highestCpu(*ranges), limit, limit - 1));
  }
  return *parseCpuList(text, limit);
}

const std::map<int, CpuSet>& CpuTopology::nodes() {
  if (nodes_) return *nodes_;
  std::map<int, CpuSet> nodes;
  const std::string dir = path("sys/devices/system/node");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    // A kernel without NUMA support: the whole machine is one node.
    nodes[0] = readCpuList(path("sys/devices/system/cpu/online"));
  } else {
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind("node", 0) != 0) continue;
      auto index = parseNonNegative(std::string_view(name).substr(4));
      if (!index) continue;
      nodes[*index] = readCpuList(it->path().string() + "/cpulist");
    }
    if (ec) throw SystemError("list " + dir, ec.value());
    if (nodes.empty()) throw DdprunError(dir + ": no node<N> directories");
  }
  nodes_ = std::move(nodes);
  return *nodes_;
}

int CpuTopology::package(int cpu) {
  auto it = packages_.find(cpu);
  if (it != packages_.end()) return it->second;
  const int id = readInt(path("sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/physical_package_id"));
  return packages_[cpu] = id;
}

const CpuSet& CpuTopology::coreSiblings(int cpu) {
  auto it = siblings_.find(cpu);
  if (it != siblings_.end()) return it->second;
  const std::string dir = path("sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/");
  std::error_code ec;
  // core_cpus_list is the newer name (Linux 5.7); thread_siblings_list the one torch reads.
  CpuSet cpus = fs::exists(dir + "core_cpus_list", ec) ? readCpuList(dir + "core_cpus_list")
                                                       : readCpuList(dir + "thread_siblings_list");
  cpus.insert(cpu);
  return siblings_[cpu] = std::move(cpus);
}

const CpuSet& CpuTopology::lastLevelCache(int cpu) {
  auto it = caches_.find(cpu);
  if (it != caches_.end()) return it->second;
  const std::string dir = path("sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/cache");
  int best_level = -1;
  CpuSet best;
  std::error_code ec;
  for (fs::directory_iterator entry(dir, ec), end; !ec && entry != end; entry.increment(ec)) {
    const std::string name = entry->path().filename().string();
    if (name.rfind("index", 0) != 0 || !parseNonNegative(std::string_view(name).substr(5))) continue;
    const std::string index = entry->path().string();
    // Instruction caches are per core; the cache a core complex shares holds data.
    std::string type(trimSysfs(readSysfsFile(index + "/type")));
    if (type != "Unified" && type != "Data") continue;
    const int level = readInt(index + "/level");
    if (level <= best_level) continue;
    best_level = level;
    best = readCpuList(index + "/shared_cpu_list");
  }
  if (ec) throw SystemError("list " + dir, ec.value());
  if (best_level < 0) throw DdprunError(dir + ": no data or unified cache described");
  best.insert(cpu);
  return caches_[cpu] = std::move(best);
}

int CpuTopology::pciNumaNode(const std::string& bdf) {
  const int node = readInt(path("sys/bus/pci/devices/" + bdf + "/numa_node"));
  return node < 0 ? 0 : node;
}

}  // namespace ddprun::agent
