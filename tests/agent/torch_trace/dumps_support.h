// Synthetic flight-recorder dumps for the tests: tests/agent/torch_trace/flight_dumps.py,
// run with Python 3, writes one scenario's dumps into a directory.
#pragma once

#include <string>
#include <vector>

#include "agent/torch_trace/flight_dump.h"
#include "agent/torch_trace/torch_dumps.h"
#include "tests/support/test_process.h"

namespace ddprun::testing {

inline std::string flightDumpsScript() { return sourceDir() + "/tests/agent/torch_trace/flight_dumps.py"; }

// Writes `scenario` into `dir` (see flight_dumps.py); returns its exit code and output.
inline RunResult writeDumps(const std::string& dir, const std::string& scenario, const std::string& style = "python",
                            int protocol = 2) {
  return run({"/usr/bin/python3", flightDumpsScript(), dir, scenario, "--style", style, "--protocol",
              std::to_string(protocol)},
             {}, std::chrono::seconds(60));
}

// The dumps of ranks 0..n-1 in `dir`, default prefix.
inline std::vector<agent::FlightDump> readDumps(const std::string& dir, int n) {
  std::vector<agent::FlightDump> dumps;
  for (int r = 0; r < n; ++r)
    dumps.push_back(agent::readFlightDumpFile(dir + "/nccl_trace_rank_" + std::to_string(r), r));
  return dumps;
}

// The dumps torch would write for ranks 0..n-1 in `dir` (torch_trace_rank_<r>), each with its
// file's stamp as it is now (none while it does not exist).
inline std::vector<agent::ExpectedDump> expectedDumps(const std::string& dir, int n) {
  std::vector<agent::ExpectedDump> expected;
  for (int r = 0; r < n; ++r) {
    const std::string path = dir + "/torch_trace_rank_" + std::to_string(r);
    expected.push_back(agent::ExpectedDump{r, path, agent::stampOf(path)});
  }
  return expected;
}

}  // namespace ddprun::testing
