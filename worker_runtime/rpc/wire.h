// The RPC wire format and its limits: what crosses a connection between two workers.
//
// A connection starts with the handshake (rpc/auth.h). After it, every message is a
// 32-byte header, `meta_bytes` of metadata (tensor table, then the body), then the
// tensors' bytes back to back. The limits below bound what one message may make a
// worker allocate; a message over them closes its connection with a logged reason.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ddprun::rpc::wire {

inline constexpr uint32_t kMagic = 0x43505244;  // "DRPC"
enum class Kind : uint8_t { kRequest = 1, kResponse = 2, kError = 3 };

struct Header {
  uint32_t magic = kMagic;
  uint8_t kind = 0;
  uint8_t flags = 0;
  uint16_t reserved = 0;
  int32_t src = -1;  // must be the rank the connection authenticated as
  uint32_t meta_bytes = 0;
  uint64_t id = 0;
  uint64_t tensor_bytes = 0;
};
static_assert(sizeof(Header) == 32);

// Metadata of one message (tensor table, function name, arguments). Read in chunks
// that at most double what has arrived, so an announced size costs nothing until sent.
inline constexpr uint32_t kMaxMetaBytes = 256u << 20;
inline constexpr size_t kFirstMetaChunk = 64u << 10;
// Tensors of one message: a parameter server's whole model is a few hundred.
inline constexpr uint32_t kMaxTensors = 1u << 16;
inline constexpr uint8_t kMaxDims = 64;

}  // namespace ddprun::rpc::wire
