#include "agent/torch_trace/pickle_reader.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <unordered_map>

#include <fmt/format.h>

#include "agent/torch_trace/pickle_opcodes.h"

namespace ddprun::agent {

const char* pickleKindName(PickleKind kind) {
  switch (kind) {
    case PickleKind::kNone: return "none";
    case PickleKind::kBool: return "bool";
    case PickleKind::kInt: return "int";
    case PickleKind::kFloat: return "float";
    case PickleKind::kString: return "string";
    case PickleKind::kBytes: return "bytes";
    case PickleKind::kTuple: return "tuple";
    case PickleKind::kList: return "list";
    case PickleKind::kDict: return "dict";
    case PickleKind::kGlobal: return "global";
  }
  return "?";
}

namespace {

using namespace pickle;  // the opcodes and globals (pickle_opcodes.h)

// The shared values at the start of every document.
constexpr uint32_t kNoneValue = 0;
constexpr uint32_t kFalseValue = 1;
constexpr uint32_t kTrueValue = 2;
constexpr uint32_t kEmptyTupleValue = 3;
constexpr uint32_t kEmptyStringValue = 4;
constexpr uint32_t kEmptyBytesValue = 5;
constexpr int64_t kSmallIntMin = -128;
constexpr int64_t kSmallIntMax = 255;
constexpr uint32_t kSmallIntValue = 6;  // kSmallIntMin's; the others follow
constexpr uint32_t kGlobalValue = kSmallIntValue + static_cast<uint32_t>(kSmallIntMax - kSmallIntMin + 1);
constexpr uint32_t kSharedValues = kGlobalValue + static_cast<uint32_t>(kGlobalCount);

// A string at least this long is stored once however often it occurs, so that comparing two
// long keys is comparing handles; a shorter one costs at most this much to compare.
constexpr size_t kInternBytes = 64;
// A dict of more pairs gets an index: get() is then a binary search.
constexpr size_t kLinearPairs = 32;
// How many opcodes (or index entries) between two looks at PickleLimits::cancel.
constexpr size_t kCancelEvery = 4096;

constexpr uint32_t kNoMemo = std::numeric_limits<uint32_t>::max();

uint32_t low(uint64_t b) { return static_cast<uint32_t>(b); }
uint32_t high(uint64_t b) { return static_cast<uint32_t>(b >> 32); }
uint64_t pack(uint32_t lo, uint32_t hi) { return uint64_t{lo} | (uint64_t{hi} << 32); }

// FNV-1a from a seed drawn once per process: a pickle cannot be made of keys whose hashes
// collide, which would turn the index's comparisons into long string compares.
uint32_t textHash(std::string_view s) {
  static const uint64_t seed = [] {
    std::random_device device;
    return (uint64_t{device()} << 32) ^ device() ^ 0xcbf29ce484222325ULL;
  }();
  uint64_t h = seed;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
  return static_cast<uint32_t>(h ^ (h >> 32));
}

}  // namespace

// The pickle machine: a stack of value handles, a stack of mark positions and a memo, all
// within a memory budget counted by capacity.
class PickleMachine {
 public:
  PickleMachine(std::string_view bytes, const PickleLimits& limits) : in_(bytes), limits_(limits) {}

  PickleDocument run() {
    if (in_.size() > limits_.max_bytes) {
      throw PickleError(fmt::format("{} bytes, more than the {} a dump may have", in_.size(), limits_.max_bytes));
    }
    if (in_.empty()) throw PickleError("empty: no pickle at all");
    budget_ = limits_.memory_floor + std::min(in_.size(), std::numeric_limits<size_t>::max() / 64) *
                                         std::min<size_t>(limits_.memory_per_byte, 64);
    start();
    for (size_t ops = 0;; ++ops) {
      if (ops % kCancelEvery == 0) checkCancel();
      op_at_ = pos_;
      const uint8_t op = byte();
      if (op == kStop) {
        if (stack_.empty() || !marks_.empty()) fail("STOP with an empty stack or a MARK still open");
        doc_.root_ = stack_.back();
        finish();
        return std::move(doc_);
      }
      step(op);
    }
  }

 private:
  template <class... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
    throw PickleError(fmt::format("at byte {}: {}", op_at_, fmt::format(format, std::forward<Args>(args)...)));
  }
  void checkCancel() {
    if (limits_.cancel && limits_.cancel->load(std::memory_order_relaxed)) throw PickleError("cancelled");
  }

  // Memory: `bytes` more are about to be allocated while what is held stays (a vector's
  // growth copies from the old block to the new one).
  void charge(size_t bytes) {
    if (bytes > budget_ || used_ > budget_ - bytes) {
      fail(
          "the pickle needs more than {} bytes of memory ({} times its {} bytes, plus {}), more than a "
          "flight-recorder dump ever does",
          budget_, limits_.memory_per_byte, in_.size(), limits_.memory_floor);
    }
    used_ += bytes;
  }
  // Room for `extra` more elements in `v`, its capacity grown by half, within the budget.
  template <class V>
  void reserveMore(V& v, size_t extra) {
    const size_t need = v.size() + extra;
    if (need <= v.capacity()) return;
    if (need > v.max_size()) fail("more values than this machine can hold");
    const size_t old_bytes = v.capacity() * sizeof(typename V::value_type);
    const size_t capacity = std::max({need, v.capacity() + v.capacity() / 2, size_t{16}});
    charge(capacity * sizeof(typename V::value_type));
    v.reserve(capacity);
    used_ -= old_bytes;
  }

  void start() {
    reserveMore(doc_.values_, kSharedValues);
    auto& v = doc_.values_;
    v.push_back({PickleKind::kNone, 0, 0});
    v.push_back({PickleKind::kBool, 0, 0});
    v.push_back({PickleKind::kBool, 0, 1});
    v.push_back({PickleKind::kTuple, 0, 0});
    v.push_back({PickleKind::kString, 0, pack(0, textHash({}))});
    v.push_back({PickleKind::kBytes, 0, pack(0, textHash({}))});
    for (int64_t n = kSmallIntMin; n <= kSmallIntMax; ++n) v.push_back({PickleKind::kInt, 0, static_cast<uint64_t>(n)});
    for (size_t g = 0; g < kGlobalCount; ++g) v.push_back({PickleKind::kGlobal, 0, g});
  }

  void need(size_t n) {
    if (in_.size() - pos_ < n) {
      throw PickleError(fmt::format("truncated: the pickle ends at byte {}, inside the opcode at byte {} (no STOP)",
                                    in_.size(), op_at_));
    }
  }
  uint8_t byte() {
    need(1);
    return static_cast<uint8_t>(in_[pos_++]);
  }
  uint64_t littleEndian(size_t n) {
    need(n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(in_[pos_ + i])} << (8 * i);
    pos_ += n;
    return v;
  }
  std::string_view take(uint64_t n, const char* what) {
    if (n > limits_.max_string_bytes)
      fail("a {} of {} bytes, more than the {} allowed", what, n, limits_.max_string_bytes);
    if (in_.size() - pos_ < n) {
      throw PickleError(fmt::format("truncated: a {} of {} bytes at byte {} runs past the end of the pickle ({} bytes)",
                                    what, n, op_at_, in_.size()));
    }
    std::string_view s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::string_view line() {
    const size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos) {
      throw PickleError(fmt::format("truncated: the GLOBAL at byte {} has no end of line", op_at_));
    }
    if (end - pos_ > 256) fail("a GLOBAL name of {} bytes", end - pos_);
    std::string_view s = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  uint32_t make(PickleKind kind, uint32_t a, uint64_t b) {
    if (doc_.values_.size() - kSharedValues >= limits_.max_values) fail("more than {} values", limits_.max_values);
    reserveMore(doc_.values_, 1);
    doc_.values_.push_back({kind, a, b});
    return static_cast<uint32_t>(doc_.values_.size() - 1);
  }
  void push(uint32_t v) {
    if (stack_.size() >= limits_.max_stack) fail("more than {} values on the stack", limits_.max_stack);
    reserveMore(stack_, 1);
    stack_.push_back(v);
  }
  uint32_t pop() {
    if (stack_.size() <= floor()) fail("{} on an empty stack", opName());
    uint32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  uint32_t top() {
    if (stack_.size() <= floor()) fail("{} on an empty stack", opName());
    return stack_.back();
  }
  // Values above the newest MARK may be popped; the ones below belong to an enclosing
  // container still being built.
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  // Drops the newest MARK: the values pushed since are stack_[returned...].
  size_t popMark() {
    if (marks_.empty()) fail("{} without a MARK", opName());
    const size_t at = marks_.back();
    marks_.pop_back();
    return at;
  }
  std::string opName() const { return fmt::format("opcode 0x{:02x}", static_cast<uint8_t>(in_[op_at_])); }

  PickleDocument::Value& value(uint32_t v) { return doc_.values_[v]; }

  void pushInt(int64_t n) {
    if (n >= kSmallIntMin && n <= kSmallIntMax) {
      push(kSmallIntValue + static_cast<uint32_t>(n - kSmallIntMin));
      return;
    }
    push(make(PickleKind::kInt, 0, static_cast<uint64_t>(n)));
  }
  void pushText(PickleKind kind, std::string_view text) {
    if (text.empty()) {
      push(kind == PickleKind::kString ? kEmptyStringValue : kEmptyBytesValue);
      return;
    }
    const uint32_t hash = textHash(text);
    auto& interned = interned_[kind == PickleKind::kString ? 0 : 1];
    if (text.size() >= kInternBytes) {
      for (auto [it, end] = interned.equal_range(hash); it != end; ++it) {
        if (textOf(it->second) == text) {
          push(it->second);
          return;
        }
      }
    }
    std::string& all = doc_.text_;
    // Each string is read from the pickle once (a long one that recurs is kept once): the
    // text is at most the pickle's size.
    reserveMore(all, text.size());
    const size_t offset = all.size();
    if (offset + text.size() > std::numeric_limits<uint32_t>::max()) fail("more string bytes than this reader holds");
    all.append(text);
    const uint32_t v = make(kind, static_cast<uint32_t>(text.size()), pack(static_cast<uint32_t>(offset), hash));
    if (text.size() >= kInternBytes) {
      // A node, its bucket, the allocator's header: an intern entry is charged at 64 bytes.
      charge(64);
      interned.emplace(hash, v);
    }
    push(v);
  }
  // A tuple of the `n` values at stack_[from...], which the caller then drops.
  void pushTuple(size_t from, size_t n) {
    if (n == 0) {
      stack_.resize(from);
      push(kEmptyTupleValue);
      return;
    }
    const uint32_t t = make(PickleKind::kTuple, 0, 0);
    addItems(t, from, n);
    stack_.resize(from);
    push(t);
  }
  // A LONG1 or LONG4 integer: little-endian two's complement, at most 64 bits here.
  void pushLong(uint64_t n) {
    if (n > 8) fail("an integer of {} bytes: more than 64 bits", n);
    need(n);
    uint64_t v = littleEndian(n);
    if (n > 0 && n < 8 && (v >> (8 * n - 1)) != 0) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    pushInt(static_cast<int64_t>(v));
  }
  // Appends stack_[from, from + n) to the container `c`. A container's items lie together in
  // items_ with room to grow; one that outgrows its room while others follow it moves to the
  // end with twice the room, so that appends cost O(1) each however they interleave.
  void addItems(uint32_t c, size_t from, size_t n) {
    PickleDocument::Value& v = value(c);
    uint32_t offset = low(v.b), capacity = high(v.b);
    const size_t count = v.a;
    auto& items = doc_.items_;
    if (count + n > std::numeric_limits<uint32_t>::max()) fail("a container of more than 2^32 items");
    if (count + n > capacity) {
      const size_t grown = std::max({count + n, size_t{capacity} * 2, size_t{4}});
      if (size_t{offset} + capacity == items.size()) {
        reserveMore(items, grown - capacity);  // the last one: it grows in place
      } else {
        reserveMore(items, grown);  // no reallocation below
        const size_t moved = items.size();
        items.resize(moved + grown);
        std::copy(items.begin() + offset, items.begin() + offset + static_cast<std::ptrdiff_t>(count),
                  items.begin() + static_cast<std::ptrdiff_t>(moved));
        offset = static_cast<uint32_t>(moved);
      }
      items.resize(size_t{offset} + grown);
      if (items.size() > std::numeric_limits<uint32_t>::max()) fail("more items than this reader can hold");
      capacity = static_cast<uint32_t>(grown);
    }
    std::copy(stack_.begin() + static_cast<std::ptrdiff_t>(from),
              stack_.begin() + static_cast<std::ptrdiff_t>(from + n), items.begin() + offset + count);
    v.a = static_cast<uint32_t>(count + n);
    v.b = pack(offset, capacity);
  }
  void appendTo(uint32_t list, size_t from, size_t n) {
    if (value(list).kind != PickleKind::kList) fail("appending to a {}, not a list", pickleKindName(value(list).kind));
    addItems(list, from, n);
  }
  void setItems(uint32_t dict, size_t from, size_t n) {
    if (value(dict).kind != PickleKind::kDict)
      fail("setting items of a {}, not a dict", pickleKindName(value(dict).kind));
    if (n % 2 != 0) fail("an odd number of values ({}) for a dict's keys and values", n);
    for (size_t i = 0; i < n; i += 2) {
      const PickleKind k = value(stack_[from + i]).kind;
      if (k == PickleKind::kList || k == PickleKind::kDict) fail("a {} as a dict key (unhashable)", pickleKindName(k));
    }
    addItems(dict, from, n);
  }
  void memoPut(uint64_t id) {
    if (id >= memo_.size()) {
      // The memo is indexed by id (picklers number them from 0); a gap costs its slots.
      if (id >= std::numeric_limits<uint32_t>::max()) fail("memo id {}", id);
      reserveMore(memo_, static_cast<size_t>(id) + 1 - memo_.size());
      memo_.resize(static_cast<size_t>(id) + 1, kNoMemo);
    }
    if (memo_[id] == kNoMemo) {
      if (memo_count_ >= limits_.max_values) fail("more than {} memo entries", limits_.max_values);
      ++memo_count_;
    }
    memo_[id] = top();
  }
  void memoGet(uint64_t id) {
    if (id >= memo_.size() || memo_[id] == kNoMemo) fail("memo entry {} read before it was written", id);
    push(memo_[id]);
  }
  void pushGlobal(std::string_view module, std::string_view name) {
    for (size_t g = 0; g < kGlobalCount; ++g) {
      const std::string_view known = kGlobals[g];
      if (known.size() == module.size() + 1 + name.size() && known.substr(0, module.size()) == module &&
          known[module.size()] == '.' && known.substr(module.size() + 1) == name) {
        push(kGlobalValue + static_cast<uint32_t>(g));
        return;
      }
    }
    fail("the pickle calls {}.{}, which a flight-recorder dump never does", printableName(module.substr(0, 256)),
         printableName(name.substr(0, 256)));
  }
  static std::string printableName(std::string_view name) {
    std::string out;
    for (char c : name) out += (c >= 0x20 && c < 0x7f) ? c : '?';
    return out;
  }
  std::string_view textOf(uint32_t v) {
    const auto& x = value(v);
    return std::string_view(doc_.text_).substr(low(x.b), x.a);
  }

  // After STOP: an index for each large dict, so that get() is a binary search.
  void finish() {
    auto& values = doc_.values_;
    for (size_t v = kSharedValues; v < values.size(); ++v) {
      if (v % kCancelEvery == 0) checkCancel();
      if (values[v].kind != PickleKind::kDict) continue;
      const uint32_t offset = low(values[v].b);
      const size_t pairs = values[v].a / 2;
      values[v].b = pack(offset, 0);
      if (pairs > kLinearPairs) buildIndex(static_cast<uint32_t>(v), offset, pairs);
    }
  }
  void buildIndex(uint32_t dict, uint32_t offset, size_t pairs) {
    auto& index = doc_.index_;
    reserveMore(index, pairs + 1);
    if (index.size() + pairs + 1 > std::numeric_limits<uint32_t>::max()) fail("more items than this reader can hold");
    const size_t at = index.size();
    index.push_back(0);
    const auto& items = doc_.items_;
    const auto& values = doc_.values_;
    for (size_t p = 0; p < pairs; ++p) {
      if (p % kCancelEvery == 0) checkCancel();
      const PickleKind k = values[items[offset + 2 * p]].kind;
      if (k == PickleKind::kString || k == PickleKind::kBytes) index.push_back(static_cast<uint32_t>(p));
    }
    auto key = [&](uint32_t p) { return items[offset + 2 * p]; };
    // By hash, then text (a long string is one value wherever it occurs: equal handles, equal
    // keys), then position; the last position of each key is kept.
    std::sort(index.begin() + static_cast<std::ptrdiff_t>(at + 1), index.end(), [&](uint32_t x, uint32_t y) {
      const uint32_t kx = key(x), ky = key(y);
      if (kx != ky) {
        const uint32_t hx = high(values[kx].b), hy = high(values[ky].b);
        if (hx != hy) return hx < hy;
        const int c = textOf(kx).compare(textOf(ky));
        if (c != 0) return c < 0;
      }
      return x < y;
    });
    checkCancel();
    size_t out = at + 1;
    for (size_t i = at + 1; i < index.size(); ++i) {
      const bool last = i + 1 == index.size() || [&] {
        const uint32_t kx = key(index[i]), ky = key(index[i + 1]);
        return kx != ky && (high(values[kx].b) != high(values[ky].b) || textOf(kx) != textOf(ky));
      }();
      if (last) index[out++] = index[i];
    }
    index.resize(out);
    index[at] = static_cast<uint32_t>(out - at - 1);
    doc_.values_[dict].b = pack(offset, static_cast<uint32_t>(at + 1));
  }

  void step(uint8_t op) {
    switch (op) {
      case kProto: {
        const uint8_t version = byte();
        if (version < 2 || version > 5) fail("pickle protocol {}; a flight-recorder dump uses 2 to 5", version);
        return;
      }
      case kFrame: {
        const uint64_t n = littleEndian(8);
        if (n > in_.size() - pos_) {
          throw PickleError(fmt::format("truncated: a frame of {} bytes at byte {} runs past the end ({} bytes)", n,
                                        op_at_, in_.size()));
        }
        return;
      }
      case kMark:
        if (marks_.size() >= limits_.max_nesting) fail("nesting deeper than {}", limits_.max_nesting);
        marks_.push_back(stack_.size());
        return;
      case kPop: pop(); return;
      case kPopMark: stack_.resize(popMark()); return;
      case kDup: push(top()); return;
      case kNone: push(kNoneValue); return;
      case kNewTrue: push(kTrueValue); return;
      case kNewFalse: push(kFalseValue); return;
      case kBinInt1: pushInt(static_cast<int64_t>(littleEndian(1))); return;
      case kBinInt2: pushInt(static_cast<int64_t>(littleEndian(2))); return;
      case kBinInt: pushInt(static_cast<int32_t>(static_cast<uint32_t>(littleEndian(4)))); return;
      case kLong1: pushLong(byte()); return;
      case kLong4: {
        const uint64_t n = littleEndian(4);
        pushLong(n);
        return;
      }
      case kBinFloat: {
        need(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(in_[pos_ + i]);  // big-endian
        pos_ += 8;
        push(make(PickleKind::kFloat, 0, bits));
        return;
      }
      case kShortBinUnicode: pushText(PickleKind::kString, take(byte(), "string")); return;
      case kBinUnicode: pushText(PickleKind::kString, take(littleEndian(4), "string")); return;
      case kBinUnicode8: pushText(PickleKind::kString, take(littleEndian(8), "string")); return;
      case kShortBinString: pushText(PickleKind::kBytes, take(byte(), "string")); return;
      case kBinString: pushText(PickleKind::kBytes, take(littleEndian(4), "string")); return;
      case kShortBinBytes: pushText(PickleKind::kBytes, take(byte(), "bytes value")); return;
      case kBinBytes: pushText(PickleKind::kBytes, take(littleEndian(4), "bytes value")); return;
      case kBinBytes8: pushText(PickleKind::kBytes, take(littleEndian(8), "bytes value")); return;
      case kEmptyTuple: push(kEmptyTupleValue); return;
      case kTuple1:
      case kTuple2:
      case kTuple3: {
        const size_t n = op == kTuple1 ? 1 : op == kTuple2 ? 2 : 3;
        if (stack_.size() < floor() + n) fail("{} on an empty stack", opName());
        pushTuple(stack_.size() - n, n);
        return;
      }
      case kTuple: {
        const size_t at = popMark();
        pushTuple(at, stack_.size() - at);
        return;
      }
      case kEmptyList: push(make(PickleKind::kList, 0, 0)); return;
      case kEmptyDict: push(make(PickleKind::kDict, 0, 0)); return;
      case kAppend: {
        if (stack_.size() < floor() + 2) fail("{} on an empty stack", opName());
        appendTo(stack_[stack_.size() - 2], stack_.size() - 1, 1);
        stack_.pop_back();
        return;
      }
      case kAppends: {
        const size_t at = popMark();
        if (at <= floor()) fail("{} on an empty stack", opName());
        appendTo(stack_[at - 1], at, stack_.size() - at);
        stack_.resize(at);
        return;
      }
      case kSetItem: {
        if (stack_.size() < floor() + 3) fail("{} on an empty stack", opName());
        setItems(stack_[stack_.size() - 3], stack_.size() - 2, 2);
        stack_.resize(stack_.size() - 2);
        return;
      }
      case kSetItems: {
        const size_t at = popMark();
        if (at <= floor()) fail("{} on an empty stack", opName());
        setItems(stack_[at - 1], at, stack_.size() - at);
        stack_.resize(at);
        return;
      }
      case kBinPut: memoPut(byte()); return;
      case kLongBinPut: memoPut(littleEndian(4)); return;
      case kMemoize: memoPut(memo_count_); return;
      case kBinGet: memoGet(byte()); return;
      case kLongBinGet: memoGet(littleEndian(4)); return;
      case kGlobal: {
        const std::string_view module = line();
        const std::string_view name = line();
        pushGlobal(module, name);
        return;
      }
      case kStackGlobal: {
        uint32_t name = pop();
        uint32_t module = pop();
        if (value(name).kind != PickleKind::kString || value(module).kind != PickleKind::kString) {
          fail("STACK_GLOBAL of a {} and a {}, not two strings", pickleKindName(value(module).kind),
               pickleKindName(value(name).kind));
        }
        pushGlobal(textOf(module), textOf(name));
        return;
      }
      case kReduce: {
        uint32_t args = pop();
        uint32_t callable = pop();
        if (value(callable).kind != PickleKind::kGlobal)
          fail("REDUCE calls a {}", pickleKindName(value(callable).kind));
        if (value(args).kind != PickleKind::kTuple || value(args).a == 0) {
          fail("{} called without arguments", kGlobals[value(callable).b]);
        }
        // build_*list(list) and restore_type_tag(value, type): the value itself.
        push(doc_.items_[low(value(args).b)]);
        return;
      }
      default: fail("opcode 0x{:02x} is not one a flight-recorder dump uses (a corrupt file, or not a pickle)", op);
    }
  }

  std::string_view in_;
  const PickleLimits& limits_;
  size_t budget_ = 0;  // bytes
  size_t used_ = 0;    // bytes, by capacity
  size_t pos_ = 0;
  size_t op_at_ = 0;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;  // at most max_nesting: not charged
  std::vector<uint32_t> memo_;
  size_t memo_count_ = 0;  // ids set: MEMOIZE's next id, as len(memo) in Python
  // The long strings and long bytes values by hash: each text is kept once.
  std::unordered_multimap<uint32_t, uint32_t> interned_[2];
  PickleDocument doc_;
};

PickleDocument PickleDocument::parse(std::string_view bytes, const PickleLimits& limits) {
  return PickleMachine(bytes, limits).run();
}

size_t PickleDocument::memoryBytes() const {
  return values_.capacity() * sizeof(Value) + items_.capacity() * sizeof(uint32_t) +
         index_.capacity() * sizeof(uint32_t) + text_.capacity();
}

PickleKind PickleRef::kind() const { return doc_->values_[index_].kind; }

bool PickleRef::asBool() const { return kind() == PickleKind::kBool && doc_->values_[index_].b != 0; }

int64_t PickleRef::asInt() const {
  const auto& v = doc_->values_[index_];
  return v.kind == PickleKind::kInt || v.kind == PickleKind::kBool ? static_cast<int64_t>(v.b) : 0;
}

double PickleRef::asFloat() const {
  const auto& v = doc_->values_[index_];
  if (v.kind == PickleKind::kFloat) {
    double d;
    std::memcpy(&d, &v.b, sizeof d);
    return d;
  }
  if (v.kind == PickleKind::kInt) return static_cast<double>(static_cast<int64_t>(v.b));
  return 0;
}

std::string_view PickleRef::asString() const {
  const auto& v = doc_->values_[index_];
  if (v.kind == PickleKind::kString || v.kind == PickleKind::kBytes) {
    return std::string_view(doc_->text_).substr(low(v.b), v.a);
  }
  if (v.kind == PickleKind::kGlobal) return kGlobals[v.b];
  return {};
}

size_t PickleRef::size() const {
  const auto& v = doc_->values_[index_];
  return v.kind == PickleKind::kTuple || v.kind == PickleKind::kList ? v.a : 0;
}

PickleRef PickleRef::at(size_t i) const {
  DDPRUN_CHECK(i < size(), fmt::format("index {} of {}", i, size()));
  return PickleRef(doc_, doc_->items_[low(doc_->values_[index_].b) + i]);
}

std::optional<PickleRef> PickleRef::get(std::string_view key) const {
  const auto& v = doc_->values_[index_];
  if (v.kind != PickleKind::kDict) return std::nullopt;
  const auto& values = doc_->values_;
  const auto& items = doc_->items_;
  const uint32_t offset = low(v.b);
  const uint32_t hash = textHash(key);
  auto text = [&](uint32_t k) { return std::string_view(doc_->text_).substr(low(values[k].b), values[k].a); };
  auto matches = [&](uint32_t k) {
    const auto& x = values[k];
    return (x.kind == PickleKind::kString || x.kind == PickleKind::kBytes) && high(x.b) == hash && text(k) == key;
  };
  if (const uint32_t index = high(v.b); index != 0) {
    const auto& positions = doc_->index_;
    auto first = positions.begin() + index;
    auto last = first + positions[index - 1];
    // Ordered by (hash, text): the first position not before the key.
    auto it = std::partition_point(first, last, [&](uint32_t p) {
      const uint32_t k = items[offset + 2 * p];
      const uint32_t h = high(values[k].b);
      return h != hash ? h < hash : text(k) < key;
    });
    if (it != last && matches(items[offset + 2 * *it])) return PickleRef(doc_, items[offset + 2 * *it + 1]);
    return std::nullopt;
  }
  for (size_t i = v.a; i >= 2; i -= 2) {
    if (matches(items[offset + i - 2])) return PickleRef(doc_, items[offset + i - 1]);
  }
  return std::nullopt;
}

std::vector<std::pair<PickleRef, PickleRef>> PickleRef::items() const {
  std::vector<std::pair<PickleRef, PickleRef>> out;
  const auto& v = doc_->values_[index_];
  if (v.kind != PickleKind::kDict) return out;
  const uint32_t offset = low(v.b);
  out.reserve(v.a / 2);
  for (size_t i = 0; i + 1 < v.a; i += 2) {
    out.emplace_back(PickleRef(doc_, doc_->items_[offset + i]), PickleRef(doc_, doc_->items_[offset + i + 1]));
  }
  return out;
}

}  // namespace ddprun::agent
