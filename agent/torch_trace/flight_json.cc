#include "agent/torch_trace/flight_json.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/text_escape.h"

namespace ddprun::agent {
namespace {

using json = nlohmann::json;

class JsonReader {
 public:
  explicit JsonReader(const std::string& what) : what_(what) {}

  [[noreturn]] void fail(const std::string& where, const std::string& why) const {
    throw FlightDumpError(where.empty() ? fmt::format("{}: {}", what_, why)
                                        : fmt::format("{}: {}: {}", what_, where, why));
  }
  const json* maybe(const json& object, const char* key) const {
    auto it = object.find(key);
    if (it == object.end() || it->is_null()) return nullptr;
    return &*it;
  }
  int64_t integer(const json& object, const char* key, const std::string& where) const {
    const json* v = maybe(object, key);
    if (v == nullptr) return 0;
    if (!v->is_number_integer()) fail(where, fmt::format("'{}' is not an integer", key));
    return v->get<int64_t>();
  }
  std::string text(const json& object, const char* key, const std::string& where, bool needed) const {
    const json* v = maybe(object, key);
    if (v == nullptr) {
      if (needed) fail(where, fmt::format("no '{}'", key));
      return {};
    }
    if (!v->is_string()) fail(where, fmt::format("'{}' is not a string", key));
    return v->get<std::string>();
  }
  std::vector<std::vector<int64_t>> sizes(const json& object, const char* key, const std::string& where) const {
    std::vector<std::vector<int64_t>> out;
    const json* v = maybe(object, key);
    if (v == nullptr) return out;
    if (!v->is_array()) fail(where, fmt::format("'{}' is not a list", key));
    for (const json& tensor : *v) {
      if (!tensor.is_array()) fail(where, fmt::format("'{}' holds a {}, not a list", key, tensor.type_name()));
      std::vector<int64_t> dims;
      for (const json& dim : tensor) {
        if (!dim.is_number_integer()) fail(where, fmt::format("'{}' holds a {}, not a size", key, dim.type_name()));
        dims.push_back(dim.get<int64_t>());
      }
      out.push_back(std::move(dims));
    }
    return out;
  }
  std::vector<std::string> strings(const json& object, const char* key, const std::string& where) const {
    std::vector<std::string> out;
    const json* v = maybe(object, key);
    if (v == nullptr) return out;
    if (!v->is_array()) fail(where, fmt::format("'{}' is not a list", key));
    for (const json& s : *v) {
      if (!s.is_string()) fail(where, fmt::format("'{}' holds a {}, not a string", key, s.type_name()));
      out.push_back(s.get<std::string>());
    }
    return out;
  }

 private:
  const std::string& what_;
};

// "[0, 1, 2]", as torch writes a group's ranks, or a list of ints.
std::vector<int> ranksOf(const json& v, const JsonReader& r, const std::string& where) {
  std::vector<int> ranks;
  auto add = [&](int64_t rank) {
    if (rank < 0 || rank > (1 << 24)) r.fail(where, fmt::format("rank {} in 'ranks'", rank));
    ranks.push_back(static_cast<int>(rank));
  };
  if (v.is_array()) {
    for (const json& rank : v) {
      if (!rank.is_number_integer()) r.fail(where, "'ranks' holds something else than ranks");
      add(rank.get<int64_t>());
    }
  } else if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    size_t i = 0;
    auto skip = [&] {
      while (i < s.size() && (s[i] == ' ' || s[i] == ',' || s[i] == '[' || s[i] == ']')) ++i;
    };
    for (skip(); i < s.size(); skip()) {
      int64_t rank = 0;
      auto [end, ec] = std::from_chars(s.data() + i, s.data() + s.size(), rank);
      if (ec != std::errc() || end == s.data() + i) {
        r.fail(where, fmt::format("'ranks' is \"{}\", not a list of ranks", printable(s.substr(0, 80))));
      }
      add(rank);
      i = static_cast<size_t>(end - s.data());
    }
  } else {
    r.fail(where, fmt::format("'ranks' is a {}, not a list", v.type_name()));
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

FlightEntry entryOf(const json& d, size_t index, const JsonReader& r) {
  const std::string where = fmt::format("entry {}", index);
  if (!d.is_object()) r.fail(where, fmt::format("a {}, not an object", d.type_name()));
  FlightEntry e;
  e.profiling_name = r.text(d, "profiling_name", where, true);
  parseProfilingName(e);
  if (r.maybe(d, "collective_seq_id") == nullptr) r.fail(where, "no 'collective_seq_id'");
  e.collective_seq_id = r.integer(d, "collective_seq_id", where);
  e.record_id = r.integer(d, "record_id", where);
  if (r.maybe(d, "pg_id") != nullptr) e.pg_id = r.integer(d, "pg_id", where);
  e.p2p_seq_id = r.integer(d, "p2p_seq_id", where);
  e.op_id = r.integer(d, "op_id", where);
  if (const json* pg = r.maybe(d, "process_group")) {
    if (!pg->is_array() || pg->empty() || !(*pg)[0].is_string()) {
      r.fail(where, "'process_group' is not a [name, desc] list");
    }
    e.pg_name = (*pg)[0].get<std::string>();
    if (pg->size() > 1 && (*pg)[1].is_string()) e.pg_desc = (*pg)[1].get<std::string>();
  } else if (e.pg_id >= 0) {
    e.pg_name = std::to_string(e.pg_id);
  } else {
    r.fail(where, "no 'process_group'");
  }
  if (const json* p2p = r.maybe(d, "is_p2p")) {
    if (!p2p->is_boolean()) r.fail(where, "'is_p2p' is not a boolean");
    e.is_p2p = p2p->get<bool>();
  } else {
    e.is_p2p = e.op == "send" || e.op == "recv";
  }
  e.input_sizes = r.sizes(d, "input_sizes", where);
  e.output_sizes = r.sizes(d, "output_sizes", where);
  e.input_dtypes = r.strings(d, "input_dtypes", where);
  e.output_dtypes = r.strings(d, "output_dtypes", where);
  const std::string state = r.text(d, "state", where, true);
  if (const auto parsed = parseFlightEntryState(state)) {
    e.state = *parsed;
  } else {
    r.fail(where,
           fmt::format("'state' is \"{}\", not scheduled, started or completed", printable(state.substr(0, 40))));
  }
  e.time_created_ns = r.integer(d, "time_created_ns", where);
  // 0 is torch's JSON for "not yet".
  if (const int64_t t = r.integer(d, "time_discovered_started_ns", where); t > 0) e.time_started_ns = t;
  if (const int64_t t = r.integer(d, "time_discovered_completed_ns", where); t > 0) e.time_completed_ns = t;
  e.timeout_ms = r.integer(d, "timeout_ms", where);
  return e;
}

}  // namespace

FlightDump parseFlightDumpJson(std::string_view bytes, const std::string& what, int rank, size_t max_entries) {
  const JsonReader r(what);
  const json root = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) r.fail("", "not readable JSON");
  if (!root.is_object())
    r.fail("", fmt::format("a JSON {}, not the object of a flight-recorder trace", root.type_name()));
  FlightDump dump;
  dump.rank = rank;
  const json* version = r.maybe(root, "version");
  if (version == nullptr) r.fail("", "no 'version': not a flight-recorder trace");
  if (version->is_string()) {
    dump.version = version->get<std::string>();
  } else if (version->is_number()) {
    dump.version = version->dump();
  } else {
    r.fail("", fmt::format("'version' is a {}", version->type_name()));
  }
  if (const json* config = r.maybe(root, "pg_config")) {
    if (!config->is_object()) r.fail("pg_config", "not an object");
    for (const auto& [key, value] : config->items()) {
      const std::string where = fmt::format("pg_config[{}]", printable(key.substr(0, 80)));
      if (!value.is_object()) r.fail(where, "not an object");
      FlightGroupConfig group;
      group.name = key;
      group.desc = r.text(value, "desc", where, false);
      if (const json* ranks = r.maybe(value, "ranks")) group.ranks = ranksOf(*ranks, r, where);
      dump.groups.push_back(std::move(group));
    }
  }
  bool cut = false;
  if (const json* entries = r.maybe(root, "entries")) {
    if (!entries->is_array()) r.fail("entries", "not a list");
    const size_t first = entries->size() > max_entries ? entries->size() - max_entries : 0;
    cut = first > 0;
    for (size_t i = first; i < entries->size(); ++i) dump.entries.push_back(entryOf((*entries)[i], i, r));
  }
  dump.truncated = cut || (!dump.entries.empty() && dump.entries.front().record_id != 0);
  return dump;
}

}  // namespace ddprun::agent
