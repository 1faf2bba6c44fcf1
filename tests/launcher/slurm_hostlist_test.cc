#include <catch2/catch.hpp>

#include "common/error.h"
#include "launcher/slurm_hostlist.h"

using ddprun::UsageError;
using ddprun::launcher::expandHostlist;
using Hosts = std::vector<std::string>;

namespace {

std::string errorOf(const std::string& list) {
  try {
    expandHostlist(list);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("hostlist: every form SLURM writes expands in order", "[hostlist]") {
  struct Case {
    const char* list;
    Hosts hosts;
  };
  const Case cases[] = {
      {"n1", {"n1"}},
      {"node-a.example.org", {"node-a.example.org"}},
      {"n1,n2,n3", {"n1", "n2", "n3"}},
      {"n[1-3]", {"n1", "n2", "n3"}},
      {"n[7]", {"n7"}},
      {"n[0-0]", {"n0"}},
      // Zero padding comes from the low bound as written.
      {"x[08-12]", {"x08", "x09", "x10", "x11", "x12"}},
      {"y[001-5]", {"y001", "y002", "y003", "y004", "y005"}},
      {"n[9-10]", {"n9", "n10"}},
      {"n[1-010]", {"n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "n10"}},
      {"n[098-101]", {"n098", "n099", "n100", "n101"}},
      // Comma lists inside brackets, order and duplicates as written.
      {"n[1,3,5-6]", {"n1", "n3", "n5", "n6"}},
      {"n[3,1,1]", {"n3", "n1", "n1"}},
      {"n1,n1,n2", {"n1", "n1", "n2"}},
      // Several brackets: the cartesian product, leftmost varying slowest.
      {"rack[1-2]-n[01-02]", {"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"}},
      {"p[1-2]q[3-4]r", {"p1q3r", "p1q4r", "p2q3r", "p2q4r"}},
      // Suffixes after ']'.
      {"gpu[1-2]-ib", {"gpu1-ib", "gpu2-ib"}},
      {"a[1,3,5-6]b", {"a1b", "a3b", "a5b", "a6b"}},
      {"rack[1-2]-n[01-02]x", {"rack1-n01x", "rack1-n02x", "rack2-n01x", "rack2-n02x"}},
      // No prefix at all.
      {"[1-3]", {"1", "2", "3"}},
      // Mixed entries; commas inside brackets do not split entries.
      {"n[1-2],gpu[01-02]-ib,login", {"n1", "n2", "gpu01-ib", "gpu02-ib", "login"}},
      // Whitespace separates too (SLURM accepts it), and may repeat.
      {"a b", {"a", "b"}},
      {" a,  b\tc ", {"a", "b", "c"}},
  };
  for (const auto& c : cases) {
    INFO("list: " << c.list);
    CHECK(expandHostlist(c.list) == c.hosts);
  }
}

TEST_CASE("hostlist: a large list expands without loss", "[hostlist]") {
  auto hosts = expandHostlist("r[0-99]n[000-999]");
  REQUIRE(hosts.size() == 100000);
  CHECK(hosts.front() == "r0n000");
  CHECK(hosts[1000] == "r1n000");
  CHECK(hosts.back() == "r99n999");
}

TEST_CASE("hostlist: malformed lists fail with one line naming the problem", "[hostlist]") {
  struct Case {
    const char* list;
    const char* message;
  };
  const Case cases[] = {
      {"", "invalid host list '': no host names"},
      {"  ", "invalid host list '  ': no host names"},
      {"n[1-3", "invalid host list 'n[1-3': '[' at position 2 is never closed"},
      {"n1]", "invalid host list 'n1]': ']' at position 3 without a '['"},
      {"n[[1]]",
       "invalid host list 'n[[1]]': '[' at position 3 inside the "
       "bracket opened at position 2"},
      {"n[]", "invalid host list 'n[]': empty range at position 3"},
      {"n[1,,2]", "invalid host list 'n[1,,2]': empty range at position 5"},
      {"n[1,]", "invalid host list 'n[1,]': empty range at position 5"},
      {"n[5-3]",
       "invalid host list 'n[5-3]': range '5-3' at position 3 goes "
       "down (5 > 3)"},
      {"n[a-b]",
       "invalid host list 'n[a-b]': range 'a-b' at position 3 is not "
       "N or LOW-HIGH with decimal numbers"},
      {"n[1-]",
       "invalid host list 'n[1-]': range '1-' at position 3 is not N "
       "or LOW-HIGH with decimal numbers"},
      {"n[-3]",
       "invalid host list 'n[-3]': range '-3' at position 3 is not N "
       "or LOW-HIGH with decimal numbers"},
      {"n[1-2-3]",
       "invalid host list 'n[1-2-3]': range '1-2-3' at position 3 "
       "is not N or LOW-HIGH with decimal numbers"},
      {"n[1, 2]",
       "invalid host list 'n[1, 2]': range ' 2' at position 5 is "
       "not N or LOW-HIGH with decimal numbers"},
      {"n[1234567890123456789]",
       "invalid host list 'n[1234567890123456789]': range "
       "'1234567890123456789' at position 3 has a number of more "
       "than 18 digits"},
      {"a,,b", "invalid host list 'a,,b': empty entry before the ',' at position 3"},
      {",a", "invalid host list ',a': empty entry before the ',' at position 1"},
      {"a,", "invalid host list 'a,': empty entry after the ',' at position 2"},
      {"a, ,b", "invalid host list 'a, ,b': empty entry before the ',' at position 4"},
      {"n[0-99999999]", "invalid host list 'n[0-99999999]': expands to more than 1048576 hosts"},
      {"n[1-1100]x[1-1000]",
       "invalid host list 'n[1-1100]x[1-1000]': expands "
       "to more than 1048576 hosts"},
      {"n[0-600000],m[0-600000]",
       "invalid host list 'n[0-600000],m[0-600000]': expands to more than "
       "1048576 hosts"},
  };
  for (const auto& c : cases) {
    INFO("list: " << c.list);
    CHECK(errorOf(c.list) == c.message);
  }
}
