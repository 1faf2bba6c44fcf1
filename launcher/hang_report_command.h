// `ddprun hang-report DIR`: the hang verdict (agent/torch_trace/dump_verdict.h) from a
// directory of torch flight-recorder dumps, named as torch's default writer names them,
// `<prefix><rank>` (prefix `nccl_trace_rank_`, or --prefix), from a job of any launcher.
#pragma once

#include <string>

#include "common/error.h"

namespace ddprun::launcher {

// The exit code for dumps that cannot be used: a corrupt or truncated one, or a rank
// without one.
inline constexpr int kExitBadDumps = 4;

// The default file-name prefix of torch's dumps (TORCH_NCCL_DEBUG_INFO_TEMP_FILE's base name).
inline constexpr const char* kDefaultDumpPrefix = "nccl_trace_rank_";

// A dump directory that cannot be judged: a dump that is corrupt, truncated or unreadable,
// or a rank without a dump. main() prints it as one line and exits kExitBadDumps.
class BadDumpsError : public DdprunError {
 public:
  using DdprunError::DdprunError;
};

// True when argv names the subcommand (argv[1] == "hang-report").
bool isHangReportCommand(int argc, const char* const* argv);

// Reads every `<prefix><rank>` file of DIR and prints the verdict to stdout. Returns 0 once
// it is printed (hang or not). Throws UsageError for bad flags, a DIR that is not a
// directory, or one without a dump of that prefix; BadDumpsError for a dump that cannot be
// read or a rank missing between 0 and the highest one (the dumps' own group lists count
// too). Blocks for the reads only.
int runHangReportCommand(int argc, const char* const* argv);

}  // namespace ddprun::launcher
