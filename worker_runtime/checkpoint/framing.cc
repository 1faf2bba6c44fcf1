// The checkpoint file's framing (framing_impl.h): the header and its CRC-32, the atomic write
// and the checked read, and verifyFile (checkpoint.h), which checks only them.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <filesystem>

#include "common/error.h"
#include "common/unique_fd.h"
#include "worker_runtime/checkpoint/checkpoint.h"
#include "worker_runtime/checkpoint/framing_impl.h"

namespace ddprun::checkpoint {
namespace detail {
namespace {

namespace fs = std::filesystem;

constexpr std::array<char, 8> kMagic = {'D', 'D', 'P', 'R', 'U', 'N', 'C', 'K'};

void putLe(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t getLe(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return value;
}

uint32_t crc32Of(const char* data, size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths: feed large payloads in slices.
  constexpr size_t kSlice = size_t{1} << 30;
  for (size_t done = 0; done < size; done += kSlice) {
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data + done), static_cast<uInt>(std::min(kSlice, size - done)));
  }
  return static_cast<uint32_t>(crc);
}

// Throws SystemError with errno as it was before the message was built (building it
// allocates, and allocation may change errno).
#define DDPRUN_CKPT_THROW_ERRNO(what) \
  do {                                \
    const int err_ = errno;           \
    throw SystemError((what), err_);  \
  } while (0)

void writeAll(int fd, const char* data, size_t size, const std::string& what) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      DDPRUN_CKPT_THROW_ERRNO(what);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Temporary files are ".<name>.tmp.<pid>" next to the target: same file system, so the
// rename is atomic, and a name no reader of checkpoint_*.ckpt ever picks up.
std::string tempPathFor(const fs::path& target) {
  return (target.parent_path() / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
}

// Reads exactly `size` bytes at the current offset of fd into out (resized to what was read).
void readFully(int fd, std::string& out, size_t size, const std::string& op) {
  out.resize(size);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd, out.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) DDPRUN_CKPT_THROW_ERRNO(op + ": read");
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out.resize(done);
}

}  // namespace

std::string headerFor(const std::string& payload) {
  std::string header(kMagic.begin(), kMagic.end());
  putLe(header, kFormatVersion, 4);
  putLe(header, crc32Of(payload.data(), payload.size()), 4);
  putLe(header, payload.size(), 8);
  putLe(header, 0, 8);
  return header;
}

void writeFileAtomically(const std::string& path, const std::string& header, const std::string& payload) {
  const fs::path target(path);
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string temp = tempPathFor(target.parent_path().empty() ? fs::path(".") / target : target);
  const std::string op = "checkpoint save(" + path + ")";

  UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) DDPRUN_CKPT_THROW_ERRNO(op + ": create " + temp);
  try {
    writeAll(fd.get(), header.data(), header.size(), op + ": write " + temp);
    writeAll(fd.get(), payload.data(), payload.size(), op + ": write " + temp);
    if (::fsync(fd.get()) != 0) DDPRUN_CKPT_THROW_ERRNO(op + ": fsync " + temp);
    // close can report a write the file system deferred (NFS, quotas): it is checked.
    if (const int err = fd.close(); err != 0) throw SystemError(op + ": close " + temp, err);
    if (::rename(temp.c_str(), path.c_str()) != 0) DDPRUN_CKPT_THROW_ERRNO(op + ": rename " + temp);
  } catch (...) {
    fd.reset();
    ::unlink(temp.c_str());
    throw;
  }
  // The rename is durable only once the directory entry is: without this a power loss
  // could bring back the old name (or none) after the caller was told the save happened.
  const UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd) DDPRUN_CKPT_THROW_ERRNO(op + ": open directory " + dir.string());
  if (::fsync(dir_fd.get()) != 0) DDPRUN_CKPT_THROW_ERRNO(op + ": fsync directory " + dir.string());
}

// Checks the header, then reads the payload; returns it or throws DdprunError. Nothing is
// allocated for the payload until the header has been found good and its size matches the
// file's: a huge sparse or foreign file costs 32 bytes, not its apparent size.
std::string readPayload(const std::string& path) {
  const std::string op = "checkpoint load(" + path + ")";
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) DDPRUN_CKPT_THROW_ERRNO(op + ": open");
  std::string header;
  std::string bytes;
  uint64_t file_size = 0;
  uint32_t crc = 0;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) DDPRUN_CKPT_THROW_ERRNO(op + ": stat");
  file_size = static_cast<uint64_t>(st.st_size);
  readFully(fd.get(), header, kHeaderSize, op);
  if (header.size() < kHeaderSize || !std::equal(kMagic.begin(), kMagic.end(), header.begin())) {
    throw DdprunError(op + ": not a ddprun checkpoint (" + std::to_string(file_size) + " bytes, no DDPRUNCK header)");
  }
  const auto version = static_cast<uint32_t>(getLe(header.data() + 8, 4));
  if (version != kFormatVersion) {
    throw DdprunError(op + ": format version " + std::to_string(version) + ", this build reads " +
                      std::to_string(kFormatVersion));
  }
  crc = static_cast<uint32_t>(getLe(header.data() + 12, 4));
  const uint64_t size = getLe(header.data() + 16, 8);
  if (size != file_size - kHeaderSize) {
    throw DdprunError(op + ": truncated or padded: header says " + std::to_string(size) +
                      " bytes of payload, file has " + std::to_string(file_size - kHeaderSize));
  }
  try {
    readFully(fd.get(), bytes, static_cast<size_t>(size), op);
  } catch (const std::bad_alloc&) {
    throw DdprunError(op + ": its " + std::to_string(size) + "-byte payload does not fit in memory");
  }
  if (bytes.size() != size) {
    throw DdprunError(op + ": truncated while reading: " + std::to_string(bytes.size()) + " of " +
                      std::to_string(size) + " bytes of payload");
  }
  fd.reset();
  const uint32_t actual = crc32Of(bytes.data(), bytes.size());
  if (actual != crc) {
    char detail[96];
    std::snprintf(detail, sizeof detail, ": damaged: CRC-32 %08x, header says %08x", actual, crc);
    throw DdprunError(op + detail);
  }
  return bytes;
}

}  // namespace detail

std::string verifyFile(const std::string& path) {
  // Any failure to read a candidate (not only a bad header: an I/O error, no memory) means
  // "skip it"; resuming then falls back to the next older checkpoint.
  try {
    detail::readPayload(path);
    return {};
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace ddprun::checkpoint
