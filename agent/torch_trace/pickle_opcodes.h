// The vocabulary of the pickle subset that pickle_reader.cc reads: the opcodes (pickletools'
// names) and the globals a flight-recorder pickle may call. Private to the reader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>

namespace ddprun::agent::pickle {

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
constexpr const char* kGlobals[] = {"torch.jit._pickle.build_intlist", "torch.jit._pickle.build_doublelist",
                                    "torch.jit._pickle.build_boollist", "torch.jit._pickle.build_genericlist",
                                    "torch.jit._pickle.restore_type_tag"};
constexpr size_t kGlobalCount = std::size(kGlobals);

}  // namespace ddprun::agent::pickle
