// A reader of the Python pickles that torch's flight recorder writes: a safe subset of the
// pickle machine (protocols 2 to 5) for plain data (None, bools, ints up to 64 bits, floats,
// strings, bytes, tuples, lists and dicts), plus the few calls torch's own C++ pickler emits
// for typed lists (torch.jit._pickle's build_intlist and friends, restore_type_tag), which
// return their argument. Nothing else is ever called or built: any other global, and every
// opcode outside that subset, is an error. Sizes, value counts and nesting are bounded, and so
// is memory: the reader holds at most PickleLimits::memory_per_byte (12) times the pickle's size
// plus memory_floor (4 MiB) — its values, containers, memo, strings, stack and lookup indexes,
// counted by capacity, a vector's growth included — and a pickle that would need more ends in
// a PickleError, as a truncated or malformed one does, naming the offset and what was wrong
// there. Time is linear in the size (a lookup in a large dict is a binary search); the
// machine never recurses, and a read can be cancelled (PickleLimits::cancel).
//
// Values live in an arena owned by the PickleDocument; a PickleRef is a handle into it. A
// memoized value that the pickle refers to twice (BINGET) is the same value, as in Python, so
// a list that contains itself is possible and harmless: nothing here walks a value
// recursively. None, the bools, the empty tuple and string, small ints (-128 to 255) and the
// allowed globals are shared by every use, and so is a long string (64 bytes or more) that
// occurs twice, so that a pickle of many tiny values costs no more than their handles.
#pragma once

#include <atomic>
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

// The bounds of one read: of the pickle, and (flight_dump.h) of the dump built from it. Each
// default fits the largest dump torch writes (a 20,000-entry buffer with Python and C++ frames
// is some tens of MiB, and reads in at most about 4 times its size) with room to spare.
struct PickleLimits {
  size_t max_bytes = size_t{1} << 30;          // the whole pickle (1 GiB)
  size_t max_string_bytes = size_t{64} << 20;  // one string or bytes value (64 MiB)
  size_t max_values = size_t{32} << 20;        // values created, memo entries included (32 Mi)
  size_t max_stack = size_t{1} << 20;          // values on the machine's stack at once
  size_t max_nesting = 512;                    // MARKs open at once: how deep containers nest
  // The reader's memory: memory_per_byte times the pickle's size, plus memory_floor.
  size_t memory_per_byte = 12;
  size_t memory_floor = size_t{4} << 20;  // 4 MiB
  // The dump built from the pickle (parseFlightDump): the newest max_entries entries are kept
  // (the older ones are left out, and the dump marked truncated, as torch's ring does), the
  // innermost max_frames frames of each; and its strings, lists and entries, counted once per
  // copy (a value the pickle shares is copied into each entry that uses it) and with every
  // string it scans, stay within dump_bytes_per_byte times the pickle's size plus
  // dump_bytes_floor: beyond it the dump is unreadable.
  size_t max_entries = 100'000;
  size_t max_frames = 512;
  size_t dump_bytes_per_byte = 16;
  size_t dump_bytes_floor = size_t{16} << 20;  // 16 MiB
  // When set, a read that finds it true stops soon (within some thousands of opcodes or
  // entries) with a PickleError or FlightDumpError "cancelled": another thread may set it.
  const std::atomic<bool>* cancel = nullptr;
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
  // The value's identity in its document: two refs to one value (a memoized one the pickle
  // names twice, a shared None or small int, a long string that recurs) have the same id.
  uint32_t id() const { return index_; }
  bool isNone() const { return kind() == PickleKind::kNone; }
  bool asBool() const;
  int64_t asInt() const;
  double asFloat() const;
  // A string's or bytes' content; a global's "module.name". Valid as long as the document.
  std::string_view asString() const;
  // Items of a tuple or list (none for any other kind).
  size_t size() const;
  PickleRef at(size_t i) const;  // requires i < size()
  // A dict's value for the string (or bytes) key `key` (the last one set, as in Python), or
  // nullopt. A binary search in a dict of more than 32 keys, a scan of the few otherwise.
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
  // outside the subset, a bound of `limits` exceeded (memory included), or "cancelled".
  // Pure; thread-compatible (a const document may be read from several threads).
  static PickleDocument parse(std::string_view bytes, const PickleLimits& limits = {});

  PickleRef root() const { return PickleRef(this, root_); }
  // The values held, the shared ones (None, small ints...) included.
  size_t valueCount() const { return values_.size(); }
  // The bytes the document holds (its vectors' capacities): at most the limits' memory bound.
  size_t memoryBytes() const;

 private:
  friend class PickleRef;
  friend class PickleMachine;
  // 16 bytes, whatever the kind: a pickle of many tiny values must not cost many times its size.
  struct Value {
    PickleKind kind = PickleKind::kNone;
    uint32_t a = 0;  // string, bytes: length; tuple, list, dict: items (a dict's keys and values)
    // int, bool: the value; float: its bits; string, bytes: offset in text_ (low 32 bits) and
    // hash (high 32); tuple, list: offset in items_ (low) and capacity (high); dict: offset in
    // items_ (low) and 1 + its index's offset in index_ (high; 0: none); global: its number.
    uint64_t b = 0;
  };
  std::vector<Value> values_;
  std::vector<uint32_t> items_;  // the containers' items: tuple, list; dict: key, value, key...
  // Large dicts' indexes: at each, the number of distinct string keys, then their pairs'
  // positions ordered by (hash, text) — the last pair of each key.
  std::vector<uint32_t> index_;
  std::string text_;  // the strings' bytes (at most the pickle's size)
  uint32_t root_ = 0;
};

}  // namespace ddprun::agent
