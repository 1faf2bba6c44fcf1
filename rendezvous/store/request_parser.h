// Parsing one client request of the TCPStore protocol out of a byte buffer, without
// allocating for anything a limit forbids: every length is checked before its bytes are
// copied. The parser is pure (no I/O) so that truncated, oversized and malformed frames
// are easy to test.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "rendezvous/store/wire_protocol.h"

namespace ddprun::rendezvous {

struct StoreLimits {
  size_t max_key_bytes = 64 * 1024;              // one key.
  size_t max_value_bytes = 64 * 1024 * 1024;     // one value.
  uint64_t max_keys_per_request = 1 << 20;       // CHECK/WAIT/MULTI_GET/MULTI_SET.
  size_t max_request_bytes = 256 * 1024 * 1024;  // one whole request.
  // One reply (MULTI_GET, LIST_KEYS): one 1 MiB key asked for 4096 times once made a 4 GiB
  // reply and took the agent down with std::bad_alloc.
  size_t max_reply_bytes = 256 * 1024 * 1024;
};

struct Request {
  wire::Command command = wire::Command::kPing;
  bool watch_key = false;  // torch 1.13's WATCH_KEY (no current equivalent).
  std::vector<std::string> keys;
  std::vector<std::string> values;  // SET/APPEND/QUEUE_PUSH: 1; COMPARE_SET: expected, desired; MULTI_SET: per key.
  int64_t amount = 0;               // ADD delta, BARRIER world size.
  uint32_t word = 0;                // VALIDATE magic, PING nonce.
  std::string blob;                 // AUTH nonce or MAC.
};

enum class ParseStatus { kComplete, kNeedMore, kError };

struct ParseResult {
  ParseStatus status = ParseStatus::kNeedMore;
  size_t consumed = 0;       // bytes of a complete request.
  size_t need_at_least = 0;  // for kNeedMore: no use retrying before this many bytes.
  std::string error;         // for kError: why the connection must close.
};

// Tells the generation from a connection's first bytes: kUnknown until enough arrived.
wire::Generation detectGeneration(std::span<const uint8_t> first_bytes);

// Parses the request at the start of `data`.
ParseResult parseRequest(std::span<const uint8_t> data, wire::Generation generation, const StoreLimits& limits,
                         Request& out);

}  // namespace ddprun::rendezvous
