// A reader of the Python pickles that torch's flight recorder writes: a safe subset of the
// pickle machine (protocols 2 to 5) for plain data (None, bools, ints up to 64 bits, floats,
// strings, bytes, tuples, lists and dicts), plus the few calls torch's own C++ pickler emits
// for typed lists (torch.jit._pickle's build_intlist and friends, restore_type_tag), which
// return their argument. Nothing else is ever called or built: any other global, and every
// opcode outside that subset, is an error. Sizes, value counts and nesting are bounded, so a
// hostile or truncated file costs at most its own size in memory and ends in one PickleError
// naming the offset and what was wrong there; the machine never recurses.
//
// Values live in an arena owned by the PickleDocument; a PickleRef is a handle into it. A
// memoized container that the pickle refers to twice (BINGET) is the same value, as in
// Python, so a list that contains itself is possible and harmless: nothing here walks a
// value recursively.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"

namespace ddprun::agent {

class PickleError : public DdprunError {
 public:
  using DdprunError::DdprunError;
};

// The bounds of one read. Each default fits the largest dump torch writes (a 20,000-entry
// buffer with Python and C++ frames is some tens of MiB) with room to spare.
struct PickleLimits {
  size_t max_bytes = size_t{1} << 30;          // the whole pickle (1 GiB)
  size_t max_string_bytes = size_t{64} << 20;  // one string or bytes value (64 MiB)
  size_t max_values = size_t{32} << 20;        // values created, memo entries included (32 Mi)
  size_t max_stack = size_t{1} << 20;          // values on the machine's stack at once
  size_t max_nesting = 512;                    // MARKs open at once: how deep containers nest
};

enum class PickleKind { kNone, kBool, kInt, kFloat, kString, kBytes, kTuple, kList, kDict, kGlobal };

// "none", "bool", "int", "float", "string", "bytes", "tuple", "list", "dict", "global".
const char* pickleKindName(PickleKind kind);

class PickleDocument;

// A value of a document; valid as long as the document. Accessors never throw: a caller checks
// kind() first (the as*() of another kind return a zero, an empty string or an empty list).
class PickleRef {
 public:
  PickleRef(const PickleDocument* doc, uint32_t index) : doc_(doc), index_(index) {}

  PickleKind kind() const;
  bool isNone() const { return kind() == PickleKind::kNone; }
  bool asBool() const;
  int64_t asInt() const;
  double asFloat() const;
  // A string's or bytes' content; a global's "module.name".
  const std::string& asString() const;
  // Items of a tuple or list (none for any other kind).
  size_t size() const;
  PickleRef at(size_t i) const;  // requires i < size()
  // A dict's value for the string key `key` (the last one set, as in Python), or nullopt.
  std::optional<PickleRef> get(std::string_view key) const;
  // A dict's (key, value) pairs in insertion order, a later duplicate key included.
  std::vector<std::pair<PickleRef, PickleRef>> items() const;

 private:
  const PickleDocument* doc_;
  uint32_t index_;
};

class PickleDocument {
 public:
  // Runs the pickle in `bytes` up to its STOP (what follows STOP is ignored). Throws
  // PickleError ("at byte N: ...") for a truncated or malformed pickle, an opcode or global
  // outside the subset, or a bound of `limits` exceeded. Pure; thread-compatible.
  static PickleDocument parse(std::string_view bytes, const PickleLimits& limits = {});

  PickleRef root() const { return PickleRef(this, root_); }
  size_t valueCount() const { return values_.size(); }

 private:
  friend class PickleRef;
  friend class PickleMachine;
  struct Value {
    PickleKind kind = PickleKind::kNone;
    int64_t number = 0;  // bool, int
    double real = 0;
    std::string text;             // string, bytes, global
    std::vector<uint32_t> items;  // tuple, list; dict: key, value, key, value...
  };
  std::vector<Value> values_;
  uint32_t root_ = 0;
};

}  // namespace ddprun::agent
