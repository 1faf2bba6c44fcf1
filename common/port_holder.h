// Who holds a TCP port. When a bind fails with EADDRINUSE on a machine that runs many jobs,
// the error names the process listening there, so the user sees which job took it.
#pragma once

#include <string>

namespace ddprun {

// "pid 1234 (python3)" for the process with a TCP socket (IPv4 or IPv6) on local `port` in
// /proc/net/tcp*: a listener first, else a connection from that port; its command name
// escaped (common/text_escape.h), as a process names itself. "" where /proc does not show one (a socket bound but not
// yet listening is not listed there): another network namespace, or a process of another user whose descriptors this
// one cannot read.
std::string portHolder(int port);

// The text to append to an "address in use" error for `port`: ", held by pid 1234 (python3)"
// or "" when the holder is not known.
std::string portHolderSuffix(int port);

}  // namespace ddprun
