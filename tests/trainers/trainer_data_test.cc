// The trainers' building blocks without processes: the IDX reader on the real
// Fashion-MNIST files and on broken ones, the data partitioner's slices and per-epoch
// orders, and the progress bar's two output modes and when it picks which.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <numeric>
#include <set>

#include "common/error.h"
#include "common/unique_fd.h"
#include "tests/support/scoped_env.h"
#include "tests/support/test_process.h"
#include "trainers/fashion_mnist_data.h"
#include "trainers/progress_bar.h"

// LibTorch brings glog, whose CHECK(cond) aborts the process; Catch's CHECK must be the
// one these tests use, so it is defined last.
#undef CHECK
#include <catch2/catch.hpp>

using namespace ddprun::testing;
using namespace ddprun::trainers;

namespace {

void writeGzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!bytes.empty())
    REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  gzclose(f);
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

// An IDX file of unsigned bytes with the given dimensions and data.
std::string idx(const std::vector<uint32_t>& dims, const std::string& data, char type = 0x08) {
  std::string out = {0, 0, type, static_cast<char>(dims.size())};
  for (uint32_t d : dims) out += be32(d);
  return out + data;
}

std::string loadError(const std::string& images, const std::string& labels) {
  try {
    loadIdxPair(images, labels);
  } catch (const ddprun::DdprunError& e) {
    return e.what();
  }
  return "no error";
}

// Runs the bar over `steps` steps into a memory stream and returns what it wrote.
std::string barOutput(bool tty, int64_t steps, int64_t every) {
  char* buffer = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&buffer, &size);
  {
    ProgressBar bar(
        {.total_steps = steps, .first_step = 0, .samples_per_step = 64, .every = every, .tty = tty, .out = out});
    for (int64_t s = 1; s <= steps; ++s) {
      bar.update(s, static_cast<double>(s));  // loss = step: window means are exact
      if (s == steps / 2) bar.message("halfway");
    }
    bar.finish();
  }
  std::fclose(out);
  std::string text(buffer, size);
  std::free(buffer);
  return text;
}

}  // namespace

TEST_CASE("the real Fashion-MNIST files load with the expected shapes and balanced labels", "[data]") {
  const Dataset train = loadFashionMnist(kFashionMnistDir, true);
  const Dataset test = loadFashionMnist(kFashionMnistDir, false);
  CHECK(train.images.sizes() == at::IntArrayRef({60000, 28, 28}));
  CHECK(test.images.sizes() == at::IntArrayRef({10000, 28, 28}));
  CHECK(train.images.scalar_type() == at::kByte);
  // Fashion-MNIST has exactly 6000 training and 1000 test images per class.
  CHECK(at::equal(at::bincount(train.labels), at::full({10}, 6000, at::kLong)));
  CHECK(at::equal(at::bincount(test.labels), at::full({10}, 1000, at::kLong)));

  std::vector<int64_t> indices = {0, 1, 2, 3};
  auto [x, y] = makeBatch(train, indices, 1, 4);
  CHECK(x.sizes() == at::IntArrayRef({3, 1, 28, 28}));
  CHECK(at::equal(y, train.labels.narrow(0, 1, 3)));
  // Normalised: a full epoch would have mean ~0 and std ~1; these pixels are at least in range.
  CHECK(x.min().item<float>() >= -0.9f);
  CHECK(x.max().item<float>() <= 2.1f);
}

TEST_CASE("broken IDX files are clear errors", "[data]") {
  TempDir dir;
  const std::string images = dir.file("images.gz");
  const std::string labels = dir.file("labels.gz");
  writeGzip(images, idx({2, 2, 2}, std::string(8, '\x01')));
  writeGzip(labels, idx({2}, std::string("\x03\x07", 2)));
  const Dataset ok = loadIdxPair(images, labels);
  CHECK(ok.size() == 2);
  CHECK(ok.labels[1].item<int64_t>() == 7);

  SECTION("missing file") {
    CHECK_THAT(loadError(dir.file("none.gz"), labels), Catch::Contains("cannot open " + dir.file("none.gz")));
  }
  SECTION("bad magic") {
    writeGzip(images, "\x12\x34\x56\x78 not idx");
    CHECK_THAT(loadError(images, labels), Catch::Contains("not an IDX file"));
  }
  SECTION("float elements") {
    writeGzip(images, idx({2, 2, 2}, std::string(32, '\0'), 0x0d));
    CHECK_THAT(loadError(images, labels), Catch::Contains("element type 0x0d"));
  }
  SECTION("data shorter than the header promises") {
    writeGzip(images, idx({2, 2, 2}, std::string(7, '\x01')));
    CHECK_THAT(loadError(images, labels), Catch::Contains("7 bytes of data, the header promises 8"));
  }
  SECTION("labels and images disagree") {
    writeGzip(labels, idx({3}, std::string(3, '\x01')));
    CHECK_THAT(loadError(images, labels), Catch::Contains("has 3 labels") && Catch::Contains("has 2 images"));
  }
  SECTION("a label outside 0-9") {
    writeGzip(labels, idx({2}, std::string("\x03\x0c", 2)));
    CHECK_THAT(loadError(images, labels), Catch::Contains("label 12 outside 0-9"));
  }
  SECTION("truncated gzip stream") {
    const std::string full = readFile(images);
    std::FILE* f = std::fopen(images.c_str(), "wb");
    std::fwrite(full.data(), 1, full.size() / 2, f);
    std::fclose(f);
    CHECK_THAT(loadError(images, labels), Catch::Contains(images));
  }
}

TEST_CASE("the data partitioner gives each rank a disjoint equal slice, reshuffled per epoch by the seed", "[data]") {
  const int64_t size = 1003;  // not a multiple of the world size
  const int world = 3;
  std::vector<DataPartitioner> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back(size, world, r, 42);

  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<int64_t> seen;
    for (const auto& p : ranks) {
      const auto slice = p.epochIndices(epoch);
      CHECK(static_cast<int64_t>(slice.size()) == size / world);
      for (int64_t i : slice) {
        CHECK(i >= 0);
        CHECK(i < size);
        seen.insert(i);
      }
    }
    CHECK(static_cast<int64_t>(seen.size()) == (size / world) * world);  // disjoint
  }
  // Deterministic per (seed, epoch), different across epochs and seeds, and a permutation.
  CHECK(ranks[0].epochIndices(1) == DataPartitioner(size, world, 0, 42).epochIndices(1));
  CHECK(ranks[0].epochIndices(0) != ranks[0].epochIndices(1));
  CHECK(ranks[0].epochIndices(0) != DataPartitioner(size, world, 0, 43).epochIndices(0));
  auto perm = DataPartitioner::permutation(size, 42, 0);
  std::sort(perm.begin(), perm.end());
  std::vector<int64_t> identity(size);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(perm == identity);
  // Pinned: the order must not change with the platform or the standard library, or
  // checkpoints taken elsewhere would resume on other data.
  const std::vector<int64_t> pinned = {2, 0, 3, 5, 9, 1, 7, 6, 4, 8};
  CHECK(DataPartitioner::permutation(10, 1234, 0) == pinned);

  CHECK_THROWS_AS(DataPartitioner(10, 2, 2, 0), ddprun::UsageError);
  CHECK_THROWS_AS(DataPartitioner(1, 2, 0, 0), ddprun::UsageError);
}

TEST_CASE("the progress bar prints lines without a terminal and redraws in place on one", "[progress]") {
  const std::string lines = barOutput(false, 100, 25);
  CHECK(countOf(lines, "\n") == 5);  // steps 25, 50, 75, 100 and the message
  CHECK(countOf(lines, "\r") == 0);
  // Each line shows the mean loss since the previous line: steps 1-25, ..., 76-100.
  CHECK(countOf(lines, "step 25/100 [#####...............]  25% loss 13.0000 ") == 1);
  CHECK(countOf(lines, "step 50/100 [##########..........]  50% loss 38.0000 ") == 1);
  CHECK(countOf(lines, "step 100/100 [####################] 100% loss 88.0000 ") == 1);
  CHECK(countOf(lines, "samples/s  ETA ") == 4);
  CHECK(countOf(lines, "halfway\n") == 1);

  const std::string tty = barOutput(true, 100, 25);
  CHECK(countOf(tty, "\r") >= 2);      // first draw, message, last step
  CHECK(countOf(tty, "\x1b[K") >= 2);  // each redraw clears the rest of the line
  CHECK(countOf(tty, "step 100/100") == 1);
  CHECK(countOf(tty, "\rhalfway\x1b[K\n") == 1);  // the bar cleared, the line, the bar again
  CHECK(tty.back() == '\n');                      // finish() ends the bar's line
}

TEST_CASE("the progress bar redraws only on a terminal whose TERM is not dumb", "[progress]") {
  // A pseudo-terminal's follower end is a terminal, as an interactive shell's stdout is.
  const ddprun::UniqueFd leader(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
  REQUIRE(leader.valid());
  REQUIRE(::grantpt(leader.get()) == 0);
  REQUIRE(::unlockpt(leader.get()) == 0);
  const ddprun::UniqueFd tty(::open(::ptsname(leader.get()), O_RDWR | O_NOCTTY | O_CLOEXEC));
  REQUIRE(tty.valid());
  int pipe_fds[2];
  REQUIRE(::pipe2(pipe_fds, O_CLOEXEC) == 0);
  const ddprun::UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  {
    ScopedEnv term("TERM", "xterm-256color");
    CHECK(ProgressBar::isTerminal(tty.get()));
    CHECK_FALSE(ProgressBar::isTerminal(write_end.get()));
  }
  {
    ScopedEnv term("TERM", std::nullopt);
    CHECK(ProgressBar::isTerminal(tty.get()));
  }
  {
    ScopedEnv term("TERM", "dumb");
    CHECK_FALSE(ProgressBar::isTerminal(tty.get()));
  }
}
