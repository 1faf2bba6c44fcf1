#include "worker_runtime/transport/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/env_names.h"
#include "common/env_reader.h"
#include "common/error.h"
#include "common/unique_fd.h"

namespace ddprun::runtime {
namespace {

// Every rank's reported failures ("rank N: why", one a line), in rank order, as one line.
std::string failuresOf(rendezvous::Store& store, const std::string& key) {
  std::vector<std::string> lines;
  std::istringstream in(store.get(key));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  std::sort(lines.begin(), lines.end(), [](const std::string& a, const std::string& b) {
    return std::stoi(a.substr(5)) < std::stoi(b.substr(5));  // the number after "rank "
  });
  std::string joined;
  for (const auto& line : lines) joined += (joined.empty() ? "" : "; ") + line;
  return "shared memory segment unusable: " + joined;
}

}  // namespace

ShmSegment::ShmSegment(rendezvous::Store& store, const std::string& prefix, int rank, int size, size_t bytes,
                       std::chrono::milliseconds timeout, ShmOpenFn open)
    : bytes_(bytes) {
  if (!open) open = ::shm_open;
  const std::string name_key = prefix + "shm/name";
  const std::string failures_key = prefix + "shm/failures";
  auto report = [&](const std::string& why) { store.append(failures_key, fmt::format("rank {}: {}\n", rank, why)); };
  std::string name;
  UniqueFd fd;
  bool failed = false;
  if (rank == 0) {
    std::random_device device;
    name = fmt::format("/ddprun-{}-{}-{:08x}", env::stringOr(env::kRunId, "job"), ::getpid(), device());
    fd.reset(open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
    // No segment, nothing for the others to open: they learn it from the empty name, at once.
    if (!fd || ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
      const int err = errno;
      if (fd) {
        fd.reset();
        ::shm_unlink(name.c_str());
      }
      report(fmt::format("cannot create a segment of {} bytes: {}", bytes, std::strerror(err)));
      store.set(name_key, "");
      throw DdprunError(failuresOf(store, failures_key));
    }
    store.set(name_key, name);
  } else {
    name = store.get(name_key);
    if (name.empty()) throw DdprunError(failuresOf(store, failures_key));
    fd.reset(open(name.c_str(), O_RDWR | O_CLOEXEC, 0600));
    if (!fd) {
      report(fmt::format("shm_open({}): {}", name, std::strerror(errno)));
      failed = true;
    }
  }
  if (fd) {
    data_ = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    const int err = errno;
    fd.reset();
    if (data_ == MAP_FAILED) {
      data_ = nullptr;
      report(fmt::format("mmap of {} bytes: {}", bytes, std::strerror(err)));
      failed = true;
    }
  }
  // Every rank arrives here, mapped or failed (and reported), before the name goes away; so
  // after the barrier every rank reads the same verdict, and either all use the segment or
  // none does.
  if (store.add(prefix + "shm/attached", 1) == size) store.set(prefix + "shm/all_attached", "1");
  store.wait({prefix + "shm/all_attached"}, timeout);
  if (rank == 0) ::shm_unlink(name.c_str());
  if (failed || store.check({failures_key})) {
    if (data_) ::munmap(data_, bytes_);
    data_ = nullptr;
    throw DdprunError(failuresOf(store, failures_key));
  }
}

ShmSegment::~ShmSegment() {
  if (data_) ::munmap(data_, bytes_);
}

}  // namespace ddprun::runtime
