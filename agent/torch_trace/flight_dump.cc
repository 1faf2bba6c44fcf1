#include "agent/torch_trace/flight_dump.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "common/text_escape.h"
#include "common/worker_file.h"

namespace ddprun::agent {

const char* flightEntryStateName(FlightEntryState state) {
  switch (state) {
    case FlightEntryState::kScheduled: return "scheduled";
    case FlightEntryState::kStarted: return "started";
    case FlightEntryState::kCompleted: return "completed";
  }
  return "?";
}

std::optional<FlightEntryState> parseFlightEntryState(std::string_view name) {
  for (FlightEntryState state :
       {FlightEntryState::kScheduled, FlightEntryState::kStarted, FlightEntryState::kCompleted}) {
    if (name == flightEntryStateName(state)) return state;
  }
  return std::nullopt;
}

const std::vector<FlightFrame>& FlightFrames::get() const {
  static const std::vector<FlightFrame> kNone;
  return frames_ ? *frames_ : kNone;
}

void FlightFrames::push_back(FlightFrame frame) {
  std::vector<FlightFrame> frames = get();
  frames.push_back(std::move(frame));
  frames_ = std::make_shared<const std::vector<FlightFrame>>(std::move(frames));
}

namespace {

// Reads typed fields out of the pickle's values; every mismatch is a FlightDumpError that
// names the file, the entry and the key. What the dump takes is counted as it is built (each
// copy of a string the pickle shares, each string scanned), within the limits' budget: a value
// that the pickle memoizes once and names in every entry costs its size in each.
class Reader {
 public:
  Reader(const std::string& what, const PickleLimits& limits, size_t pickle_bytes)
      : what_(what),
        limits_(limits),
        budget_(limits.dump_bytes_floor + std::min(pickle_bytes, std::numeric_limits<size_t>::max() / 64) *
                                              std::min<size_t>(limits.dump_bytes_per_byte, 64)),
        pickle_bytes_(pickle_bytes) {}

  [[noreturn]] void fail(const std::string& where, const std::string& message) const {
    throw FlightDumpError(fmt::format("{}: {}{}", what_, where.empty() ? "" : where + ": ", message));
  }

  // `bytes` more of the dump (or of work on it): beyond the budget the dump is unreadable.
  void charge(size_t bytes, const std::string& where) const {
    if (bytes > budget_ || spent_ > budget_ - bytes) {
      fail(where, fmt::format("the dump would take more than {} bytes ({} times the pickle's {} bytes, plus {}), more "
                              "than a flight-recorder dump ever does",
                              budget_, limits_.dump_bytes_per_byte, pickle_bytes_, limits_.dump_bytes_floor));
    }
    spent_ += bytes;
  }
  void checkCancel() const {
    if (limits_.cancel && limits_.cancel->load(std::memory_order_relaxed)) {
      throw FlightDumpError(fmt::format("{}: cancelled", what_));
    }
  }
  // A string value's copy, charged.
  std::string text(const PickleRef& v, const std::string& where) const {
    const std::string_view s = v.asString();
    charge(sizeof(std::string) + s.size(), where);
    return std::string(s);
  }
  const PickleLimits& limits() const { return limits_; }
  // How many things of `each` bytes the budget has room for.
  size_t room(size_t each) const { return (budget_ - spent_) / each; }

  PickleRef need(const PickleRef& dict, std::string_view key, PickleKind kind, const std::string& where) const {
    auto v = dict.get(key);
    if (!v) fail(where, fmt::format("no '{}'", key));
    expect(*v, kind, fmt::format("'{}'", key), where);
    return *v;
  }
  std::optional<PickleRef> maybe(const PickleRef& dict, std::string_view key, PickleKind kind,
                                 const std::string& where) const {
    auto v = dict.get(key);
    if (!v || v->isNone()) return std::nullopt;
    expect(*v, kind, fmt::format("'{}'", key), where);
    return v;
  }
  void expect(const PickleRef& v, PickleKind kind, const std::string& name, const std::string& where) const {
    PickleKind got = v.kind();
    // A tuple reads as a list, bytes as a string, a bool as an int: Python pickles either.
    if (got == PickleKind::kTuple && kind == PickleKind::kList) return;
    if (got == PickleKind::kBytes && kind == PickleKind::kString) return;
    if (got == PickleKind::kBool && kind == PickleKind::kInt) return;
    if (got != kind) fail(where, fmt::format("{} is a {}, not a {}", name, pickleKindName(got), pickleKindName(kind)));
  }

  std::vector<std::vector<int64_t>> sizes(const PickleRef& list, const std::string& name,
                                          const std::string& where) const {
    std::vector<std::vector<int64_t>> out;
    for (size_t i = 0; i < list.size(); ++i) {
      PickleRef shape = list.at(i);
      expect(shape, PickleKind::kList, fmt::format("{}[{}]", name, i), where);
      charge(sizeof(std::vector<int64_t>) + shape.size() * sizeof(int64_t), where);
      std::vector<int64_t>& dims = out.emplace_back();
      for (size_t j = 0; j < shape.size(); ++j) {
        expect(shape.at(j), PickleKind::kInt, fmt::format("{}[{}][{}]", name, i, j), where);
        dims.push_back(shape.at(j).asInt());
      }
    }
    return out;
  }
  std::vector<std::string> strings(const PickleRef& list, const std::string& name, const std::string& where) const {
    std::vector<std::string> out;
    for (size_t i = 0; i < list.size(); ++i) {
      expect(list.at(i), PickleKind::kString, fmt::format("{}[{}]", name, i), where);
      out.push_back(text(list.at(i), where));
    }
    return out;
  }

  // The innermost max_frames frames of the list `v`: one FlightFrames for each distinct stack
  // (the same strings and lines of the pickle, frame by frame), so that a call site's entries
  // share theirs, and the list the pickle names again (memoized) is not read again.
  FlightFrames frames(const PickleRef& v, const std::string& where) const {
    if (auto it = by_list_.find(v.id()); it != by_list_.end()) return it->second;
    const size_t kept = std::min(v.size(), limits_.max_frames);
    struct Refs {
      std::optional<PickleRef> name, filename, line;
    };
    std::vector<Refs> refs;
    refs.reserve(kept);
    std::vector<int64_t> key;  // per frame: the name's and file name's values, and the line
    key.reserve(3 * kept);
    for (size_t i = 0; i < kept; ++i) {
      const std::string fwhere = fmt::format("{}: frame {}", where, i);
      PickleRef f = v.at(i);
      expect(f, PickleKind::kDict, "it", fwhere);
      Refs& r = refs.emplace_back();
      r.name = maybe(f, "name", PickleKind::kString, fwhere);
      r.filename = maybe(f, "filename", PickleKind::kString, fwhere);
      r.line = maybe(f, "line", PickleKind::kInt, fwhere);
      key.push_back(r.name ? int64_t{r.name->id()} : -1);
      key.push_back(r.filename ? int64_t{r.filename->id()} : -1);
      key.push_back(r.line ? r.line->asInt() : 0);
    }
    charge(64, where);  // the list's entry below
    auto [it, fresh] = by_stack_.try_emplace(std::move(key));
    if (fresh) {
      charge(64 + it->first.size() * sizeof(int64_t) + kept * sizeof(FlightFrame), where);
      std::vector<FlightFrame> out;
      out.reserve(kept);
      for (const Refs& r : refs) {
        FlightFrame& frame = out.emplace_back();
        if (r.name) frame.name = text(*r.name, where);
        if (r.filename) frame.filename = text(*r.filename, where);
        if (r.line) frame.line = r.line->asInt();
      }
      it->second = FlightFrames(std::move(out));
    }
    by_list_.emplace(v.id(), it->second);
    return it->second;
  }

 private:
  const std::string& what_;
  const PickleLimits& limits_;
  const size_t budget_;
  const size_t pickle_bytes_;
  mutable size_t spent_ = 0;
  mutable std::unordered_map<uint32_t, FlightFrames> by_list_;     // by the list's value
  mutable std::map<std::vector<int64_t>, FlightFrames> by_stack_;  // by frames()'s key
};

// "[0, 1, 2]" (how torch writes a group's ranks) or a list of ints.
std::vector<int> parseRanks(const PickleRef& v, const Reader& r, const std::string& where) {
  std::vector<int> ranks;
  auto add = [&](int64_t rank) {
    if (rank < 0 || rank > (1 << 24)) r.fail(where, fmt::format("rank {} in 'ranks'", rank));
    r.charge(sizeof(int), where);
    ranks.push_back(static_cast<int>(rank));
  };
  if (v.kind() == PickleKind::kList || v.kind() == PickleKind::kTuple) {
    for (size_t i = 0; i < v.size(); ++i) {
      r.expect(v.at(i), PickleKind::kInt, fmt::format("'ranks'[{}]", i), where);
      add(v.at(i).asInt());
    }
  } else if (v.kind() == PickleKind::kString) {
    const std::string_view s = v.asString();
    r.charge(s.size(), where);  // scanned: a group dict named by many keys is scanned for each
    size_t i = 0;
    auto skip = [&] {
      while (i < s.size() && (s[i] == ' ' || s[i] == ',' || s[i] == '[' || s[i] == ']')) ++i;
    };
    skip();
    while (i < s.size()) {
      int64_t rank = 0;
      auto [end, ec] = std::from_chars(s.data() + i, s.data() + s.size(), rank);
      if (ec != std::errc() || end == s.data() + i) {
        r.fail(where, fmt::format("'ranks' is \"{}\", not a list of ranks", printable(s.substr(0, 80))));
      }
      add(rank);
      i = static_cast<size_t>(end - s.data());
      skip();
    }
  } else {
    r.fail(where, fmt::format("'ranks' is a {}, not a list", pickleKindName(v.kind())));
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

FlightEntry parseEntry(const PickleRef& d, size_t index, const Reader& r) {
  const std::string where = fmt::format("entry {}", index);
  r.expect(d, PickleKind::kDict, "it", where);
  r.checkCancel();
  r.charge(sizeof(FlightEntry), where);
  FlightEntry e;
  e.profiling_name = r.text(r.need(d, "profiling_name", PickleKind::kString, where), where);
  parseProfilingName(e);
  // torch 2.2 named the collective sequence number `seq_id`.
  if (auto v = r.maybe(d, "collective_seq_id", PickleKind::kInt, where)) {
    e.collective_seq_id = v->asInt();
  } else if (auto old = r.maybe(d, "seq_id", PickleKind::kInt, where)) {
    e.collective_seq_id = old->asInt();
  } else {
    r.fail(where, "no 'collective_seq_id'");
  }
  if (auto v = r.maybe(d, "record_id", PickleKind::kInt, where)) e.record_id = v->asInt();
  if (auto v = r.maybe(d, "pg_id", PickleKind::kInt, where)) e.pg_id = v->asInt();
  if (auto v = r.maybe(d, "p2p_seq_id", PickleKind::kInt, where)) e.p2p_seq_id = v->asInt();
  if (auto v = r.maybe(d, "op_id", PickleKind::kInt, where)) e.op_id = v->asInt();
  if (auto pg = r.maybe(d, "process_group", PickleKind::kList, where)) {
    if (pg->size() < 1) r.fail(where, "'process_group' is empty");
    r.expect(pg->at(0), PickleKind::kString, "'process_group'[0]", where);
    e.pg_name = r.text(pg->at(0), where);
    if (pg->size() > 1) {
      r.expect(pg->at(1), PickleKind::kString, "'process_group'[1]", where);
      e.pg_desc = r.text(pg->at(1), where);
    }
  } else if (e.pg_id >= 0) {
    e.pg_name = std::to_string(e.pg_id);
  } else {
    r.fail(where, "no 'process_group'");
  }
  if (auto v = r.maybe(d, "is_p2p", PickleKind::kBool, where)) {
    e.is_p2p = v->asBool();
  } else {
    e.is_p2p = e.op == "send" || e.op == "recv";
  }
  if (auto v = r.maybe(d, "input_sizes", PickleKind::kList, where)) e.input_sizes = r.sizes(*v, "'input_sizes'", where);
  if (auto v = r.maybe(d, "output_sizes", PickleKind::kList, where)) {
    e.output_sizes = r.sizes(*v, "'output_sizes'", where);
  }
  if (auto v = r.maybe(d, "input_dtypes", PickleKind::kList, where)) {
    e.input_dtypes = r.strings(*v, "'input_dtypes'", where);
  }
  if (auto v = r.maybe(d, "output_dtypes", PickleKind::kList, where)) {
    e.output_dtypes = r.strings(*v, "'output_dtypes'", where);
  }
  const std::string_view state = r.need(d, "state", PickleKind::kString, where).asString();
  if (const auto parsed = parseFlightEntryState(state)) {
    e.state = *parsed;
  } else {
    r.fail(where,
           fmt::format("'state' is \"{}\", not scheduled, started or completed", printable(state.substr(0, 40))));
  }
  if (auto v = r.maybe(d, "time_created_ns", PickleKind::kInt, where)) e.time_created_ns = v->asInt();
  // torch writes 0 for "not yet" in its JSON dumps and None in its pickles.
  if (auto v = r.maybe(d, "time_discovered_started_ns", PickleKind::kInt, where); v && v->asInt() > 0) {
    e.time_started_ns = v->asInt();
  }
  if (auto v = r.maybe(d, "time_discovered_completed_ns", PickleKind::kInt, where); v && v->asInt() > 0) {
    e.time_completed_ns = v->asInt();
  }
  if (auto v = r.maybe(d, "timeout_ms", PickleKind::kInt, where)) e.timeout_ms = v->asInt();
  if (auto frames = r.maybe(d, "frames", PickleKind::kList, where)) e.frames = r.frames(*frames, where);
  return e;
}

// torch's own frames (its Python package, the C++ symbolizer's "??"), and Python's.
bool isTorchFrame(const FlightFrame& f) {
  const std::string& file = f.filename;
  return file.empty() || file == "??" || file.find("/torch/") != std::string::npos || file.rfind("torch/", 0) == 0 ||
         file.find("<frozen ") != std::string::npos || file.rfind("/usr/lib/python3", 0) == 0;
}

bool isInstalledPackage(const FlightFrame& f) {
  return f.filename.find("/site-packages/") != std::string::npos ||
         f.filename.find("/dist-packages/") != std::string::npos;
}

}  // namespace

void parseProfilingName(FlightEntry& e) {
  std::string_view name = e.profiling_name;
  if (auto colon = name.find(':'); colon != std::string_view::npos) name.remove_prefix(colon + 1);
  std::string_view meta;
  if (auto space = name.find(' '); space != std::string_view::npos) {
    meta = name.substr(space + 1);
    name = name.substr(0, space);
  }
  e.op = std::string(name);
  auto two = [&](std::string_view sep, int& first, int& second) {
    auto at = meta.find(sep);
    if (at == std::string_view::npos) return;
    int a = -1, b = -1;
    auto r1 = std::from_chars(meta.data(), meta.data() + at, a);
    auto r2 = std::from_chars(meta.data() + at + sep.size(), meta.data() + meta.size(), b);
    if (r1.ec == std::errc() && r1.ptr == meta.data() + at && r2.ec == std::errc() &&
        r2.ptr == meta.data() + meta.size() && a >= 0 && b >= 0) {
      first = a;
      second = b;
    }
  };
  if (e.op == "send") two("->", e.p2p_src, e.p2p_dst);
  if (e.op == "recv") two("<-", e.p2p_dst, e.p2p_src);
}

FlightDump parseFlightDump(std::string_view bytes, const std::string& what, const PickleLimits& limits) {
  PickleDocument doc = [&] {
    try {
      return PickleDocument::parse(bytes, limits);
    } catch (const PickleError& e) {
      throw FlightDumpError(fmt::format("{}: not a readable pickle: {}", what, e.what()));
    }
  }();
  const Reader r(what, limits, bytes.size());
  const PickleRef root = doc.root();
  if (root.kind() != PickleKind::kDict) {
    r.fail("",
           fmt::format("the pickle holds a {}, not the dict of a flight-recorder dump", pickleKindName(root.kind())));
  }
  FlightDump dump;
  auto version = root.get("version");
  if (!version) r.fail("", "no 'version': not a flight-recorder dump");
  if (version->kind() == PickleKind::kString) {
    dump.version = r.text(*version, "");
  } else if (version->kind() == PickleKind::kInt) {
    dump.version = std::to_string(version->asInt());
  } else if (version->kind() == PickleKind::kFloat) {
    dump.version = fmt::format("{}", version->asFloat());
  } else {
    r.fail("", fmt::format("'version' is a {}", pickleKindName(version->kind())));
  }
  if (auto config = r.maybe(root, "pg_config", PickleKind::kDict, "")) {
    for (const auto& [key, value] : config->items()) {
      const std::string where = fmt::format("pg_config[{}]", printable(key.asString().substr(0, 80)));
      r.expect(key, PickleKind::kString, "the key", "pg_config");
      r.expect(value, PickleKind::kDict, "it", where);
      r.checkCancel();
      r.charge(sizeof(FlightGroupConfig), where);
      FlightGroupConfig group;
      group.name = r.text(key, where);
      if (auto v = r.maybe(value, "desc", PickleKind::kString, where)) group.desc = r.text(*v, where);
      if (auto v = value.get("ranks"); v && !v->isNone()) group.ranks = parseRanks(*v, r, where);
      dump.groups.push_back(std::move(group));
    }
  }
  bool cut = false;
  if (auto entries = r.maybe(root, "entries", PickleKind::kList, "")) {
    // The newest max_entries: a verdict reads where the ranks stand, at the end of the ring.
    const size_t first = entries->size() > limits.max_entries ? entries->size() - limits.max_entries : 0;
    cut = first > 0;
    dump.entries.reserve(std::min(entries->size() - first, r.room(sizeof(FlightEntry))));
    for (size_t i = first; i < entries->size(); ++i) dump.entries.push_back(parseEntry(entries->at(i), i, r));
  }
  dump.truncated = cut || (!dump.entries.empty() && dump.entries.front().record_id != 0);
  return dump;
}

FlightDump readFlightDumpFile(const std::string& path, int rank, const PickleLimits& limits) {
  // One open that never waits (a FIFO renamed over the dump after a stat would block an
  // open by path), checked on the descriptor, and a read bounded even if the file grows.
  struct stat st {};
  int err = 0;
  const UniqueFd fd = openWorkerFile(path, st, nullptr, &err);
  if (err == EINVAL) throw FlightDumpError(fmt::format("{}: not a regular file", path));
  if (err == ELOOP) throw FlightDumpError(fmt::format("{}: a symbolic link, not followed", path));
  if (!fd) throw FlightDumpError(fmt::format("{}: cannot read it: {}", path, std::strerror(err)));
  if (static_cast<uint64_t>(st.st_size) > limits.max_bytes) {
    throw FlightDumpError(
        fmt::format("{}: {} bytes, more than the {} a dump may have", path, st.st_size, limits.max_bytes));
  }
  const WorkerFile file = readWorkerFd(fd.get(), st, path, limits.max_bytes);
  if (!file.ok()) throw FlightDumpError(fmt::format("{}: read failed: {}", path, std::strerror(file.error)));
  if (file.cut) {
    throw FlightDumpError(fmt::format("{}: more than the {} bytes a dump may have", path, limits.max_bytes));
  }
  FlightDump dump = parseFlightDump(file.bytes, path, limits);
  dump.rank = rank;
  return dump;
}

std::optional<FlightFrame> callSite(const std::vector<FlightFrame>& frames) {
  if (frames.empty()) return std::nullopt;
  // The user's script first, then a library it called torch through (accelerate, say).
  for (const FlightFrame& f : frames) {
    if (!isTorchFrame(f) && !isInstalledPackage(f)) return f;
  }
  for (const FlightFrame& f : frames) {
    if (!isTorchFrame(f)) return f;
  }
  return frames.front();
}

}  // namespace ddprun::agent
