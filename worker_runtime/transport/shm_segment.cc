#include "worker_runtime/transport/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "common/error.h"
#include "common/unique_fd.h"

namespace ddprun::runtime {

ShmSegment::ShmSegment(rendezvous::Store& store, const std::string& prefix, int rank, int size, size_t bytes,
                       std::chrono::milliseconds timeout)
    : bytes_(bytes) {
  const std::string name_key = prefix + "shm/name";
  std::string name;
  UniqueFd fd;
  if (rank == 0) {
    std::random_device device;
    const char* run_id = std::getenv("TORCHELASTIC_RUN_ID");
    name = fmt::format("/ddprun-{}-{}-{:08x}", run_id ? run_id : "job", ::getpid(), device());
    fd.reset(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
    // An unusable segment is reported through the store too, so no rank waits for it.
    if (!fd || ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
      int err = errno;
      if (fd) {
        fd.reset();
        ::shm_unlink(name.c_str());
      }
      store.set(name_key, "");
      throw DdprunError(fmt::format("shared memory segment of {} bytes: {}", bytes, std::strerror(err)));
    }
    store.set(name_key, name);
  } else {
    name = store.get(name_key);
    if (name.empty()) throw DdprunError("rank 0 could not create the shared memory segment");
    fd.reset(::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600));
    if (!fd) throw DdprunError(fmt::format("shm_open({}): {}", name, std::strerror(errno)));
  }
  data_ = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  const int err = errno;
  fd.reset();
  if (data_ == MAP_FAILED) {
    data_ = nullptr;
    store.add(prefix + "shm/failed", 1);
  }
  // Everyone has mapped it (or failed) before the name goes away; and either every rank
  // uses the segment or none does.
  if (store.add(prefix + "shm/attached", 1) == size) store.set(prefix + "shm/all_attached", "1");
  store.wait({prefix + "shm/all_attached"}, timeout);
  if (rank == 0) ::shm_unlink(name.c_str());
  if (store.add(prefix + "shm/failed", 0) > 0) {
    if (data_) ::munmap(data_, bytes_);
    throw DdprunError(data_ != nullptr ? "another rank could not map the shared memory segment"
                            : fmt::format("mmap of the shared memory segment: {}", std::strerror(err)));
  }
}

ShmSegment::~ShmSegment() {
  if (data_) ::munmap(data_, bytes_);
}

}  // namespace ddprun::runtime
