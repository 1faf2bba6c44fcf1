#include "agent/ops/error_file.h"

#include <sstream>

#include <fmt/format.h>

#define BOOST_BIND_GLOBAL_PLACEHOLDERS
#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>

#include "common/text_escape.h"
#include "common/worker_file.h"

namespace ddprun::agent {

std::optional<WorkerErrorRecord> readErrorFile(const std::string& path) {
  if (path.empty()) return std::nullopt;
  // The worker chose what is at this path: the bytes are read with the reader that never
  // blocks on a FIFO nor follows a link, and parsed from memory.
  const WorkerFile file = readWorkerFile(path, kMaxErrorFileBytes);
  if (file.missing() || (file.ok() && file.bytes.empty())) return std::nullopt;
  WorkerErrorRecord record;
  if (!file.ok()) {
    record.message = "(error file " + file.problem + ")";
    return record;
  }
  if (file.cut) {
    record.message = fmt::format("(error file {}: more than the {} bytes an error file may have; not read)",
                                 printable(path), kMaxErrorFileBytes);
    return record;
  }
  namespace pt = boost::property_tree;
  try {
    pt::ptree root;
    std::istringstream in(file.bytes);
    pt::read_json(in, root);
    const auto& message = root.get_child("message");
    if (message.empty()) {
      record.message = message.get_value<std::string>();
    } else {
      record.message = message.get<std::string>("message", "");
      record.traceback = message.get<std::string>("extraInfo.py_callstack", "");
      if (auto ts = message.get_optional<double>("extraInfo.timestamp")) record.timestamp = *ts;
    }
  } catch (const std::exception& e) {
    record.message = "(error file " + path + " is not valid JSON: " + e.what() + ")";
  }
  return record;
}

}  // namespace ddprun::agent
