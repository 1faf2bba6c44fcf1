#include "launcher/version.h"

#include <fmt/format.h>

// Both generated into the build tree: the version at configure time, the revision at every
// build (cmake/GitRevision.cmake rewrites it only when it changes).
#include "ddprun_git_revision.h"
#include "ddprun_version.h"

namespace ddprun::launcher {

std::string versionText() {
  std::string revision = DDPRUN_GIT_REVISION;
  std::string text = revision.empty() ? fmt::format("ddprun {}\n", DDPRUN_VERSION)
                                      : fmt::format("ddprun {} (git {})\n", DDPRUN_VERSION, revision);
  // The two TCPStore generations the store and its clients speak (rendezvous/PROTOCOL.md).
  text += "store wire: torch 2.x TCPStore (VALIDATE handshake), torch 1.13 TCPStore\n";
  return text;
}

}  // namespace ddprun::launcher
