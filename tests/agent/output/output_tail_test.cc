#include "agent/output/output_tail.h"

#include <string>

#include <catch2/catch.hpp>

using ddprun::agent::OutputTail;

TEST_CASE("the output tail keeps the last lines without their terminators", "[output_tail]") {
  OutputTail tail;
  CHECK(tail.text().empty());
  tail.add("first\n");
  tail.add("progress 50%\r");
  tail.add("no newline");
  CHECK(tail.text() == "first\nprogress 50%\nno newline\n");
  for (int i = 0; i < 100; ++i) tail.add("line " + std::to_string(i) + "\n");
  CHECK(tail.lines() == OutputTail::kMaxLines);
  CHECK(tail.text().rfind("line 80\n", 0) == 0);
  CHECK(tail.text().size() >= 8);
  CHECK(tail.text().substr(tail.text().size() - 8) == "line 99\n");
}

TEST_CASE("the output tail is bounded in bytes and keeps the end of a huge line", "[output_tail]") {
  OutputTail tail;
  tail.add("before\n");
  tail.add(std::string(OutputTail::kMaxBytes * 3, 'x') + "END\n");
  const std::string text = tail.text();
  CHECK(tail.lines() == 1);
  CHECK(text.size() == OutputTail::kMaxBytes + 1);
  CHECK(text.substr(text.size() - 4) == "END\n");
  for (int i = 0; i < 10; ++i) tail.add(std::string(1000, 'a' + i));
  CHECK(tail.text().size() <= OutputTail::kMaxBytes + OutputTail::kMaxLines);
  CHECK(tail.text().substr(tail.text().size() - 2) == "j\n");
}
