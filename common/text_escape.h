// Text that another process wrote, made safe to show or to store: a worker's timer scope,
// its error message, an events-file field. printable() is the one way ddprun puts such a
// string into its log, its console and its reports, so that a worker cannot start a line of
// its own (a forged "[ddprun] info: ..."), move the cursor or recolour the terminal;
// utf8SequenceLength() is the UTF-8 check that printable() and jsonString() share.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ddprun {

// The length (1 to 4) of the well-formed UTF-8 sequence that starts at text[i], or 0 when
// none does there (a stray continuation byte, a truncated sequence, an overlong form, a
// surrogate, a code point past U+10FFFF, or 0xC0, 0xC1, 0xF5..0xFF). Requires i < size.
size_t utf8SequenceLength(std::string_view text, size_t i);

enum class Newlines {
  kEscape,  // '\n' shows as \n: the text stays on one line (a log line's field)
  kKeep,    // '\n' and '\t' pass: text of several lines that the caller indents (a report)
};

// `text` with every byte or character that could act on a terminal or end a line escaped:
// \n \r \t (see `newlines`), \xNN for other control bytes, DEL and each byte of an invalid
// UTF-8 sequence, and \uNNNN for the C1 controls (U+0080..U+009F) and the bidirectional
// overrides (U+202A..U+202E, U+2066..U+2069). Valid UTF-8 otherwise passes as it is, and
// so does a backslash: the result is for reading, not for parsing back. Never throws
// (beyond std::bad_alloc).
std::string printable(std::string_view text, Newlines newlines = Newlines::kEscape);

// printable(text) of at most the first `max_bytes` of `text`, followed by "... (N bytes)"
// with text's whole size when it was longer: a peer's text quoted in a message (an etcd reply,
// ddprun's last console line) stays readable and bounded, and says how much there was.
std::string printableCut(std::string_view text, size_t max_bytes);

}  // namespace ddprun
