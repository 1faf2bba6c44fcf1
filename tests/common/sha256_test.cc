// SHA-256 and HMAC-SHA256 against the published vectors (FIPS 180-2, RFC 4231), plus
// messages whose lengths sit on the padding boundaries, where hand-written SHA-256
// implementations usually break.
#include "common/sha256.h"

#include <catch2/catch.hpp>
#include <string>

using namespace ddprun;

namespace {

std::string hex(const Sha256Digest& d) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : d) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

// Bytes (7i + 3) mod 256: not ASCII-only, so sign-extension mistakes show.
std::string pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7 + 3) & 0xff);
  return s;
}

}  // namespace

TEST_CASE("sha256 matches the FIPS 180-2 vectors", "[sha256]") {
  CHECK(hex(sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex(sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // The 448-bit message: the padding needs a second block.
  CHECK(hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(hex(sha256(std::string(1000000, 'a'))) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("sha256 pads correctly at every block boundary", "[sha256]") {
  // Expected values from Python's hashlib.
  struct Case {
    size_t length;
    const char* digest;
  };
  const Case cases[] = {
      {55, "e7313d333c272e639f790978283f9eb392e843d0f29b7016828bb1daa4aac70b"},
      {56, "4324d65f3c103567f5589c710bc08f8523f929a9272e3af36fc968e52abc6c27"},
      {63, "81c80242132f230c3bd41b3e63bbcff16107339549214a99614ff26664625055"},
      {64, "39e3d7b6b5d075d37d053ad89b24b41bef4f3c29760c84447cab3f3be1882241"},
      {65, "aacca6ff74fdbb296d165a45cecfa04e5127bc008770fbbdd48006f2d2fae95e"},
      {119, "9ce7368e4daf32341631b492e80359dc9f594b48453cd0dd5bf0b19279cc177e"},
      {120, "7836b787757e95e58b3ca5aec90b1b004e8deba1e50e9675af9cabf1a13a04b5"},
      {128, "d2742f1f4ac6bb7ca2b239ee18402ba8b3f9f8e652d2a72973c2b9ba11c08cf6"},
  };
  for (const auto& c : cases) {
    INFO("message of " << c.length << " bytes");
    CHECK(hex(sha256(pattern(c.length))) == c.digest);
  }
}

TEST_CASE("hmacSha256 matches RFC 4231", "[sha256]") {
  SECTION("test case 1: 20-byte key") {
    CHECK(hex(hmacSha256(std::string(20, '\x0b'), "Hi There")) ==
          "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  }
  SECTION("test case 2: key shorter than the output") {
    CHECK(hex(hmacSha256("Jefe", "what do ya want for nothing?")) ==
          "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  }
  SECTION("test case 3: binary key and data") {
    CHECK(hex(hmacSha256(std::string(20, '\xaa'), std::string(50, '\xdd'))) ==
          "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  }
  SECTION("test case 6: key longer than a block is hashed first") {
    CHECK(hex(hmacSha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")) ==
          "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  }
  SECTION("a key of exactly one block is used as is") {
    CHECK(hex(hmacSha256(std::string(64, '\xaa'), "x")) ==
          "ce3c639dcb9d8baae5d44c3b8b5e233faab4d1860e07489af5c84f213998bd79");
  }
}

TEST_CASE("constantTimeEqual compares contents and lengths", "[sha256]") {
  CHECK(constantTimeEqual("", ""));
  CHECK(constantTimeEqual("proof", "proof"));
  CHECK_FALSE(constantTimeEqual("proof", "proog"));
  CHECK_FALSE(constantTimeEqual("Proof", "proof"));
  CHECK_FALSE(constantTimeEqual("proof", "proof!"));
  CHECK_FALSE(constantTimeEqual("proof", ""));
  CHECK(constantTimeEqual(std::string("a\0b", 3), std::string("a\0b", 3)));
  CHECK_FALSE(constantTimeEqual(std::string("a\0b", 3), std::string("a\0c", 3)));
}
