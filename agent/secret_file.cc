#include "agent/secret_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/error.h"
#include "common/unique_fd.h"

namespace ddprun::agent {

void writeSecretFile(const std::string& path, const std::string& secret) {
  ::unlink(path.c_str());  // a fresh inode: no earlier file's mode or other links survive
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) throw SystemError("cannot create the RPC secret file " + path, errno);
  const std::string line = secret + "\n";
  const bool ok =
      ::fchmod(fd.get(), 0600) == 0 && ::write(fd.get(), line.data(), line.size()) == static_cast<ssize_t>(line.size());
  const int err = errno;
  fd.reset();
  if (!ok) throw SystemError("cannot write the RPC secret file " + path, err);
}

}  // namespace ddprun::agent
