#include "agent/ops/error_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#define BOOST_BIND_GLOBAL_PLACEHOLDERS
#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>

namespace ddprun::agent {

std::optional<WorkerErrorRecord> readErrorFile(const std::string& path) {
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(path, ec) || std::filesystem::file_size(path, ec) == 0) {
    return std::nullopt;
  }
  namespace pt = boost::property_tree;
  WorkerErrorRecord record;
  try {
    pt::ptree root;
    std::ifstream in(path);
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
