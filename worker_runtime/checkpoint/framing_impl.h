// The checkpoint file's framing (checkpoint.h): a header with a CRC-32 of the payload in front
// of LibTorch's archive, written atomically and read back checked. The checkpoint library's
// insides, shared by its own files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddprun::checkpoint::detail {

// File layout: a 32-byte header, then LibTorch's archive (a zip, as torch.save writes).
//   0  "DDPRUNCK"   magic
//   8  u32          format version
//  12  u32          CRC-32 of the payload
//  16  u64          payload size in bytes
//  24  u64          reserved (0)
// All integers little-endian. The CRC and size make truncation and damage detectable
// before LibTorch's parser sees the bytes (it would otherwise fail deep inside, or not at all).
inline constexpr uint32_t kFormatVersion = 1;
inline constexpr size_t kHeaderSize = 32;

// The header for `payload`.
std::string headerFor(const std::string& payload);

// Writes `header` then `payload` to `path` atomically: a temporary file in the same directory,
// fsync, rename, fsync of the directory. Throws SystemError naming the step that failed; the
// temporary file is then removed.
void writeFileAtomically(const std::string& path, const std::string& header, const std::string& payload);

// Checks the header, then reads the payload; returns it or throws DdprunError. Nothing is
// allocated for the payload until the header has been found good and its size matches the
// file's: a huge sparse or foreign file costs 32 bytes, not its apparent size.
std::string readPayload(const std::string& path);

}  // namespace ddprun::checkpoint::detail
