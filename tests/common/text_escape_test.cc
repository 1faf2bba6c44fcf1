#include "common/text_escape.h"

#include <catch2/catch.hpp>

using ddprun::Newlines;
using ddprun::printable;
using ddprun::utf8SequenceLength;

TEST_CASE("well-formed UTF-8 sequences are measured and malformed ones are not", "[text_escape]") {
  CHECK(utf8SequenceLength("a", 0) == 1);
  CHECK(utf8SequenceLength("\xc3\xa9", 0) == 2);
  CHECK(utf8SequenceLength("\xe2\x82\xac", 0) == 3);
  CHECK(utf8SequenceLength("\xf0\x9f\x98\x80", 0) == 4);
  CHECK(utf8SequenceLength("\xf4\x8f\xbf\xbf", 0) == 4);  // U+10FFFF
  CHECK(utf8SequenceLength("\xff", 0) == 0);
  CHECK(utf8SequenceLength("\x80", 0) == 0);              // a continuation byte alone
  CHECK(utf8SequenceLength("\xc3", 0) == 0);              // truncated
  CHECK(utf8SequenceLength("\xe2\x82", 0) == 0);          // truncated
  CHECK(utf8SequenceLength("\xc3\x41", 0) == 0);          // not a continuation
  CHECK(utf8SequenceLength("\xc1\xbf", 0) == 0);          // overlong
  CHECK(utf8SequenceLength("\xe0\x80\xaf", 0) == 0);      // overlong
  CHECK(utf8SequenceLength("\xf0\x80\x80\xaf", 0) == 0);  // overlong
  CHECK(utf8SequenceLength("\xed\xa0\x80", 0) == 0);      // a surrogate
  CHECK(utf8SequenceLength("\xf4\x90\x80\x80", 0) == 0);  // past U+10FFFF
  CHECK(utf8SequenceLength("\xf5\x80\x80\x80", 0) == 0);
}

// Issue 39, defect 6: a timer scope with a newline forged "[ddprun] info:" lines.
TEST_CASE("printable keeps a worker's text on its line and away from the terminal", "[text_escape]") {
  CHECK(printable("train_step 3/4 \xc3\xa9t\xc3\xa9 \xe2\x82\xac") == "train_step 3/4 \xc3\xa9t\xc3\xa9 \xe2\x82\xac");
  CHECK(printable("x\n[ddprun] info: forged") == "x\\n[ddprun] info: forged");
  CHECK(printable("a\r\tb") == "a\\r\\tb");
  CHECK(printable("\x1b[2J\x1b]0;title\x07") == "\\x1b[2J\\x1b]0;title\\x07");
  CHECK(printable(std::string("nul\0del\x7f", 8)) == "nul\\x00del\\x7f");
  CHECK(printable("bad\xff\xc3") == "bad\\xff\\xc3");
  CHECK(printable("\xc2\x9b"
                  "31m") == "\\u009b31m");  // C1 CSI
  CHECK(printable("\xe2\x80\xae"
                  "evil") == "\\u202eevil");  // right-to-left override
  CHECK(printable("back\\slash") == "back\\slash");
  CHECK(printable("") == "");
}

TEST_CASE("printable can keep the lines and tabs of a text of several lines", "[text_escape]") {
  CHECK(printable("Traceback:\n\tline 1\r\n\x1b[31mE\n", Newlines::kKeep) == "Traceback:\n\tline 1\\r\n\\x1b[31mE\n");
}

TEST_CASE("printableCut keeps a short text whole and cuts a long one saying its size", "[text_escape]") {
  CHECK(ddprun::printableCut("ok\x1b[2J", 16) == "ok\\x1b[2J");
  CHECK(ddprun::printableCut(std::string(10, 'a'), 10) == std::string(10, 'a'));
  // The cut is escaped too: a peer's escape code at the bound cannot slip through.
  CHECK(ddprun::printableCut("abc\n" + std::string(100, 'x'), 4) == "abc\\n... (104 bytes)");
}
