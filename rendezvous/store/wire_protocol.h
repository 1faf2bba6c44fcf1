// The TCPStore wire protocol, as torch's clients speak it (see rendezvous/PROTOCOL.md).
// Two generations share the framing and differ in command numbering:
//  - current: every connection opens with VALIDATE + kValidationMagic;
//  - torch 1.13: no handshake, its own numbering, WATCH_KEY.
// Integers are little-endian; strings and byte vectors carry a u64 length prefix.
#pragma once

#include <cstdint>
#include <string>

namespace ddprun::rendezvous::wire {

inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;

// Commands of the current generation.
enum class Command : uint8_t {
  kValidate = 0,
  kSet = 1,
  kCompareSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kGetNumKeys = 7,
  kDeleteKey = 8,
  kAppend = 9,
  kMultiGet = 10,
  kMultiSet = 11,
  kCancelWait = 12,
  kPing = 13,
  kQueuePush = 14,
  kQueuePop = 15,
  kQueueLen = 16,
  kListKeys = 17,
  kBarrier = 18,
  // ddprun's extension, never sent by torch: challenge-response with a shared token.
  kAuthHello = 0x60,
  kAuthProof = 0x61,
};

// Commands of torch 1.13's generation, mapped onto the current ones by the reader.
enum class LegacyCommand : uint8_t {
  kSet = 0,
  kCompareSet = 1,
  kGet = 2,
  kAdd = 3,
  kCheck = 4,
  kWait = 5,
  kGetNumKeys = 6,
  kWatchKey = 7,
  kDeleteKey = 8,
};

enum class CheckResponse : uint8_t { kReady = 0, kNotReady = 1 };
enum class WaitResponse : uint8_t { kStopWaiting = 0, kWaitCanceled = 1 };
// torch 1.13's watch notifications.
enum class WatchResponse : uint8_t { kKeyUpdated = 0, kKeyCreated = 1, kKeyDeleted = 2, kCallbackRegistered = 3 };

enum class Generation { kUnknown, kCurrent, kLegacy };

inline constexpr size_t kAuthNonceBytes = 16;
inline constexpr size_t kAuthMacBytes = 32;

// Appends a fixed-width integer as it travels (little-endian, as the host stores it).
template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

// Appends a string or byte vector: u64 length, then the bytes.
inline void putBytes(std::string& out, const std::string& bytes) {
  put<uint64_t>(out, bytes.size());
  out += bytes;
}

}  // namespace ddprun::rendezvous::wire
