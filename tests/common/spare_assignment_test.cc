// The spare's assignment on the wire (common/spare_assignment.h): what the agent writes turns
// the spare's environment into exactly the newcomer's, read in any pieces the pipe gives.
#include "common/spare_assignment.h"

#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "common/error.h"

namespace ddprun::recovery {
namespace {

std::map<std::string, std::string> applied(std::map<std::string, std::string> env, const SpareAssignment& a) {
  for (const auto& [name, value] : a.set) env[name] = value;
  for (const std::string& name : a.unset) env.erase(name);
  return env;
}

}  // namespace

TEST_CASE("spare assignment: applied to the spare's environment it gives the worker's, read byte by byte") {
  const std::map<std::string, std::string> spare{
      {"DDPRUN_SPARE", "1"}, {"DDPRUN_SPARE_FD", "7"}, {"WORLD_SIZE", "2"}, {"PATH", "/bin"}};
  const std::map<std::string, std::string> worker{
      {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"PATH", "/bin"}, {"NOTE", "a=b c\nd"}, {"EMPTY", ""}};
  const std::string wire = encodeSpareAssignment(spare, worker);
  SpareAssignmentReader reader;
  std::optional<SpareAssignment> got;
  for (size_t i = 0; i < wire.size(); ++i) {
    INFO("byte " << i);
    auto a = reader.add(std::string_view(wire).substr(i, 1));
    CHECK(a.has_value() == (i + 1 == wire.size()));  // complete only at its last byte
    if (a) got = std::move(a);
  }
  REQUIRE(got);
  CHECK(applied(spare, *got) == worker);
  CHECK(got->set.size() == 3);  // RANK, NOTE, EMPTY: not what is the same already
  CHECK(got->unset.size() == 2);
}

TEST_CASE("spare assignment: the same environment is an empty assignment, bytes after its end are ignored") {
  const std::map<std::string, std::string> env{{"A", "1"}};
  const std::string wire = encodeSpareAssignment(env, env);
  CHECK(wire == std::string(1, '\0'));
  SpareAssignmentReader reader;
  auto a = reader.add(wire + "B=2" + std::string(1, '\0'));
  REQUIRE(a);
  CHECK(a->set.empty());
  CHECK(a->unset.empty());
  CHECK_FALSE(reader.add("C=3"));
}

TEST_CASE("spare assignment: what the wire cannot carry is refused with the variable named") {
  CHECK_THROWS_WITH(encodeSpareAssignment({}, {{"A=B", "1"}}), Catch::Contains("'A=B'"));
  CHECK_THROWS_WITH(encodeSpareAssignment({}, {{"A", std::string("x\0y", 3)}}), Catch::Contains("A's value"));
  SpareAssignmentReader reader;
  CHECK_THROWS_WITH(reader.add(std::string("=1\0", 3)), Catch::Contains("without a name"));
}

}  // namespace ddprun::recovery
