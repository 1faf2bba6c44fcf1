// `ddprun hostnames [EXPR...]`: SLURM host lists expanded, one host per line, like
// `scontrol show hostnames`, for clusters whose compute nodes lack scontrol.
#pragma once

namespace ddprun::launcher {

// True when argv names the hostnames subcommand (argv[1] == "hostnames").
bool isHostnamesCommand(int argc, const char* const* argv);

// Prints the hosts of each EXPR (or of $SLURM_JOB_NODELIST when none is given) to
// stdout, one per line, in order, duplicates kept; -h/--help prints the usage. Returns
// the exit code (0). Throws UsageError for a malformed list, an unknown option, or no
// list at all; nothing is printed then.
int runHostnamesCommand(int argc, const char* const* argv);

}  // namespace ddprun::launcher
