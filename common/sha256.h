// SHA-256 and HMAC-SHA256, for the challenge-response of the store's token and of RPC
// (common/challenge_response.h). Small and dependency-free; checked against the FIPS 180-2
// and RFC 4231 vectors in the tests.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace ddprun {

using Sha256Digest = std::array<uint8_t, 32>;

Sha256Digest sha256(std::string_view data);
Sha256Digest hmacSha256(std::string_view key, std::string_view message);

// Compares in time independent of where the inputs differ.
bool constantTimeEqual(std::string_view a, std::string_view b);

}  // namespace ddprun
