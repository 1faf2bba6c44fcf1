#include <catch2/catch.hpp>

#include "agent/output/line_splitter.h"

using ddprun::agent::LineSplitter;

namespace {

struct Collected {
  std::vector<std::string> lines;
  LineSplitter::Emit emit() {
    return [this](std::string_view line) { lines.emplace_back(line); };
  }
};

}  // namespace

TEST_CASE("partial writes are joined into whole lines", "[line_splitter]") {
  LineSplitter splitter;
  Collected c;
  splitter.feed("hel", c.emit());
  CHECK(c.lines.empty());
  splitter.feed("lo\nwor", c.emit());
  REQUIRE(c.lines.size() == 1);
  CHECK(c.lines[0] == "hello\n");
  splitter.feed("ld\nnext\n", c.emit());
  CHECK(c.lines == std::vector<std::string>{"hello\n", "world\n", "next\n"});
}

// Issue 39, defect 14: under --tee each "\r\n" line also printed an empty "[rank0]:" line.
TEST_CASE("CRLF is one line end, also when the two bytes come in different reads", "[line_splitter]") {
  LineSplitter splitter;
  Collected c;
  splitter.feed("one\r\ntwo\r", c.emit());
  splitter.feed("\nthree\r\n", c.emit());
  CHECK(c.lines == std::vector<std::string>{"one\r\n", "two\r\n", "three\r\n"});
}

TEST_CASE("a bare carriage return ends no line and stays inside it", "[line_splitter]") {
  LineSplitter splitter;
  Collected c;
  splitter.feed(" 10%\r 20%\r", c.emit());
  CHECK(c.lines.empty());
  splitter.feed("100%\n", c.emit());
  CHECK(c.lines == std::vector<std::string>{" 10%\r 20%\r100%\n"});
  splitter.feed("\r", c.emit());
  splitter.flush(c.emit());
  CHECK(c.lines.back() == "\r\n");
}

TEST_CASE("flush emits the unterminated tail with a newline", "[line_splitter]") {
  LineSplitter splitter;
  Collected c;
  splitter.feed("no newline", c.emit());
  splitter.flush(c.emit());
  splitter.flush(c.emit());
  CHECK(c.lines == std::vector<std::string>{"no newline\n"});
}

TEST_CASE("a huge unterminated line is released once it reaches the cap", "[line_splitter]") {
  LineSplitter splitter;
  Collected c;
  std::string chunk(LineSplitter::kMaxHeld / 2, 'x');
  splitter.feed(chunk, c.emit());
  CHECK(c.lines.empty());
  splitter.feed(chunk, c.emit());
  REQUIRE(c.lines.size() == 1);
  CHECK(c.lines[0].size() == LineSplitter::kMaxHeld);
}
