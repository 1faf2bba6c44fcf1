#include "agent/hang/torch_trace/pickle_reader.h"

#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

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

const std::string kEmpty;

// The pickle opcodes of the subset (pickletools' names).
enum Op : uint8_t {
  kMark = '(',
  kStop = '.',
  kPop = '0',
  kPopMark = '1',
  kDup = '2',
  kBinFloat = 'G',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kBinInt2 = 'M',
  kNone = 'N',
  kReduce = 'R',
  kBinString = 'T',
  kShortBinString = 'U',
  kBinUnicode = 'X',
  kBinBytes = 'B',
  kShortBinBytes = 'C',
  kAppend = 'a',
  kGlobal = 'c',
  kAppends = 'e',
  kBinGet = 'h',
  kLongBinGet = 'j',
  kEmptyList = ']',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kSetItems = 'u',
  kEmptyDict = '}',
  kEmptyTuple = ')',
  kProto = 0x80,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kLong4 = 0x8b,
  kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d,
  kBinBytes8 = 0x8e,
  kStackGlobal = 0x93,
  kMemoize = 0x94,
  kFrame = 0x95,
};

// The globals a flight-recorder pickle may call: torch's C++ pickler wraps typed lists in
// them (torch/csrc/jit/serialization/pickler.cpp), and each returns its first argument.
bool allowedGlobal(const std::string& name) {
  return name == "torch.jit._pickle.build_intlist" || name == "torch.jit._pickle.build_doublelist" ||
         name == "torch.jit._pickle.build_boollist" || name == "torch.jit._pickle.build_genericlist" ||
         name == "torch.jit._pickle.restore_type_tag";
}

}  // namespace

// The pickle machine: a stack of value indices, a stack of mark positions and a memo.
class PickleMachine {
 public:
  PickleMachine(std::string_view bytes, const PickleLimits& limits) : in_(bytes), limits_(limits) {}

  PickleDocument run() {
    if (in_.size() > limits_.max_bytes) {
      throw PickleError(fmt::format("{} bytes, more than the {} a dump may have", in_.size(), limits_.max_bytes));
    }
    if (in_.empty()) throw PickleError("empty: no pickle at all");
    while (true) {
      op_at_ = pos_;
      const uint8_t op = byte();
      if (op == kStop) {
        if (stack_.empty() || !marks_.empty()) fail("STOP with an empty stack or a MARK still open");
        doc_.root_ = stack_.back();
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

  uint32_t make(PickleKind kind) {
    if (doc_.values_.size() >= limits_.max_values) fail("more than {} values", limits_.max_values);
    doc_.values_.emplace_back();
    doc_.values_.back().kind = kind;
    return static_cast<uint32_t>(doc_.values_.size() - 1);
  }
  void push(uint32_t v) {
    if (stack_.size() >= limits_.max_stack) fail("more than {} values on the stack", limits_.max_stack);
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
  // The values pushed since the newest MARK, which is dropped.
  std::vector<uint32_t> popMark() {
    if (marks_.empty()) fail("{} without a MARK", opName());
    const size_t at = marks_.back();
    marks_.pop_back();
    std::vector<uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(at), stack_.end());
    stack_.resize(at);
    return items;
  }
  std::string opName() const { return fmt::format("opcode 0x{:02x}", static_cast<uint8_t>(in_[op_at_])); }

  PickleDocument::Value& value(uint32_t v) { return doc_.values_[v]; }

  void pushInt(int64_t n) {
    uint32_t v = make(PickleKind::kInt);
    value(v).number = n;
    push(v);
  }
  void pushText(PickleKind kind, std::string_view text) {
    uint32_t v = make(kind);
    value(v).text.assign(text);
    push(v);
  }
  void pushTuple(std::vector<uint32_t> items) {
    uint32_t v = make(PickleKind::kTuple);
    value(v).items = std::move(items);
    push(v);
  }
  // A LONG1 or LONG4 integer: little-endian two's complement, at most 64 bits here.
  void pushLong(uint64_t n) {
    if (n > 8) fail("an integer of {} bytes: more than 64 bits", n);
    need(n);
    uint64_t v = littleEndian(n);
    if (n > 0 && n < 8 && (v >> (8 * n - 1)) != 0) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    pushInt(static_cast<int64_t>(v));
  }
  void appendTo(uint32_t list, const std::vector<uint32_t>& items) {
    if (value(list).kind != PickleKind::kList) fail("appending to a {}, not a list", pickleKindName(value(list).kind));
    auto& dst = value(list).items;
    dst.insert(dst.end(), items.begin(), items.end());
  }
  void setItems(uint32_t dict, const std::vector<uint32_t>& kv) {
    if (value(dict).kind != PickleKind::kDict)
      fail("setting items of a {}, not a dict", pickleKindName(value(dict).kind));
    if (kv.size() % 2 != 0) fail("an odd number of values ({}) for a dict's keys and values", kv.size());
    for (size_t i = 0; i < kv.size(); i += 2) {
      const PickleKind k = value(kv[i]).kind;
      if (k == PickleKind::kList || k == PickleKind::kDict) fail("a {} as a dict key (unhashable)", pickleKindName(k));
    }
    auto& dst = value(dict).items;
    dst.insert(dst.end(), kv.begin(), kv.end());
  }
  void memoPut(uint64_t id) {
    if (memo_.size() >= limits_.max_values) fail("more than {} memo entries", limits_.max_values);
    memo_[id] = top();
  }
  void memoGet(uint64_t id) {
    auto it = memo_.find(id);
    if (it == memo_.end()) fail("memo entry {} read before it was written", id);
    push(it->second);
  }
  void pushGlobal(std::string name) {
    if (!allowedGlobal(name)) {
      fail("the pickle calls {}, which a flight-recorder dump never does", printableName(name));
    }
    pushText(PickleKind::kGlobal, name);
  }
  static std::string printableName(const std::string& name) {
    std::string out;
    for (char c : name) out += (c >= 0x20 && c < 0x7f) ? c : '?';
    return out;
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
      case kPopMark: popMark(); return;
      case kDup: push(top()); return;
      case kNone: push(make(PickleKind::kNone)); return;
      case kNewTrue:
      case kNewFalse: {
        uint32_t v = make(PickleKind::kBool);
        value(v).number = op == kNewTrue ? 1 : 0;
        push(v);
        return;
      }
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
        double d;
        std::memcpy(&d, &bits, sizeof d);
        uint32_t v = make(PickleKind::kFloat);
        value(v).real = d;
        push(v);
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
      case kEmptyTuple: pushTuple({}); return;
      case kTuple1: {
        uint32_t a = pop();
        pushTuple({a});
        return;
      }
      case kTuple2: {
        uint32_t b = pop();
        uint32_t a = pop();
        pushTuple({a, b});
        return;
      }
      case kTuple3: {
        uint32_t c = pop();
        uint32_t b = pop();
        uint32_t a = pop();
        pushTuple({a, b, c});
        return;
      }
      case kTuple: pushTuple(popMark()); return;
      case kEmptyList: push(make(PickleKind::kList)); return;
      case kEmptyDict: push(make(PickleKind::kDict)); return;
      case kAppend: {
        uint32_t item = pop();
        appendTo(top(), {item});
        return;
      }
      case kAppends: {
        std::vector<uint32_t> items = popMark();
        appendTo(top(), items);
        return;
      }
      case kSetItem: {
        uint32_t v = pop();
        uint32_t k = pop();
        setItems(top(), {k, v});
        return;
      }
      case kSetItems: {
        std::vector<uint32_t> kv = popMark();
        setItems(top(), kv);
        return;
      }
      case kBinPut: memoPut(byte()); return;
      case kLongBinPut: memoPut(littleEndian(4)); return;
      case kMemoize: memoPut(memo_.size()); return;
      case kBinGet: memoGet(byte()); return;
      case kLongBinGet: memoGet(littleEndian(4)); return;
      case kGlobal: {
        std::string module(line());
        std::string name(line());
        pushGlobal(module + "." + name);
        return;
      }
      case kStackGlobal: {
        uint32_t name = pop();
        uint32_t module = pop();
        if (value(name).kind != PickleKind::kString || value(module).kind != PickleKind::kString) {
          fail("STACK_GLOBAL of a {} and a {}, not two strings", pickleKindName(value(module).kind),
               pickleKindName(value(name).kind));
        }
        pushGlobal(value(module).text + "." + value(name).text);
        return;
      }
      case kReduce: {
        uint32_t args = pop();
        uint32_t callable = pop();
        if (value(callable).kind != PickleKind::kGlobal)
          fail("REDUCE calls a {}", pickleKindName(value(callable).kind));
        if (value(args).kind != PickleKind::kTuple || value(args).items.empty()) {
          fail("{} called without arguments", value(callable).text);
        }
        // build_*list(list) and restore_type_tag(value, type): the value itself.
        push(value(args).items.front());
        return;
      }
      default: fail("opcode 0x{:02x} is not one a flight-recorder dump uses (a corrupt file, or not a pickle)", op);
    }
  }

  std::string_view in_;
  const PickleLimits& limits_;
  size_t pos_ = 0;
  size_t op_at_ = 0;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, uint32_t> memo_;
  PickleDocument doc_;
};

PickleDocument PickleDocument::parse(std::string_view bytes, const PickleLimits& limits) {
  return PickleMachine(bytes, limits).run();
}

PickleKind PickleRef::kind() const { return doc_->values_[index_].kind; }

bool PickleRef::asBool() const { return kind() == PickleKind::kBool && doc_->values_[index_].number != 0; }

int64_t PickleRef::asInt() const {
  const auto& v = doc_->values_[index_];
  return v.kind == PickleKind::kInt || v.kind == PickleKind::kBool ? v.number : 0;
}

double PickleRef::asFloat() const {
  const auto& v = doc_->values_[index_];
  if (v.kind == PickleKind::kFloat) return v.real;
  if (v.kind == PickleKind::kInt) return static_cast<double>(v.number);
  return 0;
}

const std::string& PickleRef::asString() const {
  const auto& v = doc_->values_[index_];
  return v.kind == PickleKind::kString || v.kind == PickleKind::kBytes || v.kind == PickleKind::kGlobal ? v.text
                                                                                                        : kEmpty;
}

size_t PickleRef::size() const {
  const auto& v = doc_->values_[index_];
  return v.kind == PickleKind::kTuple || v.kind == PickleKind::kList ? v.items.size() : 0;
}

PickleRef PickleRef::at(size_t i) const {
  DDPRUN_CHECK(i < size(), fmt::format("index {} of {}", i, size()));
  return PickleRef(doc_, doc_->values_[index_].items[i]);
}

std::optional<PickleRef> PickleRef::get(std::string_view key) const {
  const auto& v = doc_->values_[index_];
  if (v.kind != PickleKind::kDict) return std::nullopt;
  for (size_t i = v.items.size(); i >= 2; i -= 2) {
    const auto& k = doc_->values_[v.items[i - 2]];
    if ((k.kind == PickleKind::kString || k.kind == PickleKind::kBytes) && k.text == key) {
      return PickleRef(doc_, v.items[i - 1]);
    }
  }
  return std::nullopt;
}

std::vector<std::pair<PickleRef, PickleRef>> PickleRef::items() const {
  std::vector<std::pair<PickleRef, PickleRef>> out;
  const auto& v = doc_->values_[index_];
  if (v.kind != PickleKind::kDict) return out;
  for (size_t i = 0; i + 1 < v.items.size(); i += 2) {
    out.emplace_back(PickleRef(doc_, v.items[i]), PickleRef(doc_, v.items[i + 1]));
  }
  return out;
}

}  // namespace ddprun::agent
