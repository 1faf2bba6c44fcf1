#include "common/spare_assignment.h"

#include "common/error.h"
#include "common/text_escape.h"

namespace ddprun::recovery {
namespace {

void checkName(const std::string& name) {
  if (name.empty() || name.find('=') != std::string::npos || name.find('\0') != std::string::npos) {
    throw UsageError("a spare's assignment cannot carry the variable name '" + printable(name) + "'");
  }
}

}  // namespace

std::string encodeSpareAssignment(const std::map<std::string, std::string>& spare,
                                  const std::map<std::string, std::string>& worker) {
  std::string out;
  for (const auto& [name, value] : worker) {
    const auto it = spare.find(name);
    if (it != spare.end() && it->second == value) continue;
    checkName(name);
    if (value.find('\0') != std::string::npos) {
      throw UsageError("a spare's assignment cannot carry " + printable(name) + "'s value: it holds a NUL byte");
    }
    out += name + "=" + value;
    out.push_back('\0');
  }
  for (const auto& [name, value] : spare) {
    if (worker.count(name)) continue;
    checkName(name);
    out += name;
    out.push_back('\0');
  }
  out.push_back('\0');
  return out;
}

std::optional<SpareAssignment> SpareAssignmentReader::add(std::string_view bytes) {
  if (done_) return std::nullopt;
  for (const char c : bytes) {
    if (c != '\0') {
      pending_.push_back(c);
      continue;
    }
    if (pending_.empty()) {
      done_ = true;
      return std::move(assignment_);
    }
    const auto eq = pending_.find('=');
    if (eq == 0) throw UsageError("a spare's assignment has an entry without a name: '" + printable(pending_) + "'");
    if (eq == std::string::npos) {
      assignment_.unset.push_back(pending_);
    } else {
      assignment_.set.emplace_back(pending_.substr(0, eq), pending_.substr(eq + 1));
    }
    pending_.clear();
  }
  return std::nullopt;
}

}  // namespace ddprun::recovery
