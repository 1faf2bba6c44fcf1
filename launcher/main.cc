// ddprun: parse the command line, fork the orphan guard, run the elastic agent.
// The one try/catch of the launcher: every error becomes one line and an exit code
// from the README's table. The line goes through the console writer, after the log lines
// queued before it; at exit the writer gets a bounded time to empty its queue.
#include <cstdio>

#include <fmt/format.h>

#include "agent/elastic_agent.h"
#include "agent/process/orphan_guard.h"
#include "common/console_writer.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/text_escape.h"
#include "launcher/cli.h"
#include "launcher/hang_report_command.h"
#include "launcher/slurm_hostnames_command.h"
#include "launcher/status_command.h"

namespace {

// The most of an error message its console line shows. Messages name their culprit in a few
// hundred bytes; one that carries a peer's text (an etcd reply, a store's answer) is cut where
// it is made, and this bound holds for the rest: a line of megabytes would stall the console
// writer and be dropped, the one line that says why ddprun stopped.
constexpr size_t kMaxErrorBytes = 4096;

// An error message as one console line: escaped (a message quoting a peer's text cannot start
// a line of its own or drive the terminal) and cut, saying how long it was.
std::string errorLine(const char* what) { return ddprun::printableCut(what, kMaxErrorBytes); }

}  // namespace

int main(int argc, char** argv) {
  using namespace ddprun;
  configureLogging("ddprun");
  try {
    if (launcher::isHostnamesCommand(argc, argv)) return launcher::runHostnamesCommand(argc, argv);
    if (launcher::isStatusCommand(argc, argv)) return launcher::runStatusCommand(argc, argv);
    if (launcher::isHangReportCommand(argc, argv)) return launcher::runHangReportCommand(argc, argv);
    launcher::ParsedCommandLine parsed = launcher::parseCommandLine(argc, argv);
    if (parsed.help_text) {
      std::fputs(parsed.help_text->c_str(), stdout);
      return agent::kExitOk;
    }
    if (parsed.version_text) {
      std::fputs(parsed.version_text->c_str(), stdout);
      return agent::kExitOk;
    }
    if (parsed.dry_run_text) {
      std::fputs(parsed.dry_run_text->c_str(), stdout);
      return agent::kExitOk;
    }
    logger("launcher")->debug("--start_method={} has no effect: workers are native processes", parsed.start_method);
    agent::OrphanGuard guard;
    agent::ElasticAgent elastic_agent(std::move(parsed.config), guard);
    return elastic_agent.run();
  } catch (const UsageError& e) {
    console().write(ConsoleStream::kStderr, fmt::format("ddprun: error: {}\n", errorLine(e.what())));
    return agent::kExitUsage;
  } catch (const launcher::BadDumpsError& e) {
    console().write(ConsoleStream::kStderr, fmt::format("ddprun: {}\n", errorLine(e.what())));
    return launcher::kExitBadDumps;
  } catch (const RendezvousError& e) {
    console().write(ConsoleStream::kStderr, fmt::format("ddprun: rendezvous failed: {}\n", errorLine(e.what())));
    return agent::kExitRendezvous;
  } catch (const std::exception& e) {
    console().write(ConsoleStream::kStderr, fmt::format("ddprun: error: {}\n", errorLine(e.what())));
    return agent::kExitWorkersFailed;
  }
}
