// The parameter-server trainer (trainers/hybrid_ps.cc) under ddprun: the seed's topology
// (two DDP trainers, a master, a parameter server) must end with the same parameters as one
// process computing the same model on the same batches; in the asynchronous mode a slow
// trainer must not hold the other back (and in the synchronous mode it must, which shows
// the check can fail).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

std::string trainer() { return binDir() + "/hybrid_ps"; }

std::string tail(const std::string& text, size_t bytes = 6000) {
  return text.size() <= bytes ? text : "..." + text.substr(text.size() - bytes);
}

std::vector<std::vector<float>> readDump(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::vector<float>> out;
  uint64_t n = 0;
  while (in.read(reinterpret_cast<char*>(&n), sizeof n)) {
    std::vector<float> v(n);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
    REQUIRE(in);
    out.push_back(std::move(v));
  }
  return out;
}

RunResult runJob(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {ddprunPath(),       "--standalone", "--nproc_per_node=4",
                                   "--term_timeout=5", "--no_python",  trainer()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = run(argv, {{"OMP_NUM_THREADS", "1"}}, 240s);
  INFO("stdout:\n" << tail(r.out));
  INFO("stderr:\n" << tail(r.err));
  REQUIRE(r.finished);
  REQUIRE(r.exit_code == 0);
  return r;
}

// "first finished: trainerA (N steps); trainerB had done M" -> {A, M}
std::pair<int, long> progress(const std::string& out) {
  std::smatch m;
  const std::regex re("first finished: trainer([01]) \\((\\d+) steps\\); trainer[01] had done (\\d+)");
  REQUIRE(std::regex_search(out, m, re));
  return {std::stoi(m[1]), std::stol(m[3])};
}

}  // namespace

TEST_CASE("hybrid trainer: parameters after K steps equal a single-process reference (1e-5 relative)", "[rpc]") {
  TempDir dir;
  const std::vector<std::string> common = {"--batches", "5", "--lr", "0.05"};
  auto dist_args = common;
  dist_args.insert(dist_args.end(), {"--dump", dir.file("dist.bin")});
  auto r = runJob(dist_args);
  CHECK(countOf(r.out, "ddprun-rpc-ps mode=sync batches=5") == 1);

  auto ref_args = std::vector<std::string>{trainer(), "--reference", "--dump", dir.file("ref.bin")};
  ref_args.insert(ref_args.end(), common.begin(), common.end());
  auto ref = run(ref_args, {{"OMP_NUM_THREADS", "1"}}, 120s);
  INFO(ref.err);
  REQUIRE(ref.finished);
  REQUIRE(ref.exit_code == 0);

  auto a = readDump(dir.file("dist.bin"));
  auto b = readDump(dir.file("ref.bin"));
  REQUIRE(a.size() == 3);  // embedding weight, Linear weight, Linear bias
  REQUIRE(b.size() == 3);
  const char* names[] = {"embedding weight", "linear weight", "linear bias"};
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(a[i].size() == b[i].size());
    double diff = 0, scale = 0;
    for (size_t k = 0; k < a[i].size(); ++k) {
      diff = std::max(diff, static_cast<double>(std::fabs(a[i][k] - b[i][k])));
      scale = std::max(scale, static_cast<double>(std::fabs(b[i][k])));
    }
    INFO(names[i] << ": max |dist - ref| = " << diff << ", max |ref| = " << scale);
    CHECK(diff <= 1e-5 * scale);
  }
}

TEST_CASE("hybrid trainer: training moves the parameters away from their initial values", "[rpc]") {
  // Guards the equality test against a run that trained nothing on either side.
  TempDir dir;
  auto r0 = run({trainer(), "--reference", "--batches", "1", "--lr", "0", "--dump", dir.file("init.bin")}, {}, 120s);
  REQUIRE(r0.exit_code == 0);
  runJob({"--batches", "3", "--dump", dir.file("dist.bin")});
  auto init = readDump(dir.file("init.bin"));
  auto trained = readDump(dir.file("dist.bin"));
  REQUIRE(init.size() == 3);
  REQUIRE(trained.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    double diff = 0;
    for (size_t k = 0; k < init[i].size(); ++k) diff = std::max(diff, double(std::fabs(init[i][k] - trained[i][k])));
    CHECK(diff > 1e-4);
  }
}

TEST_CASE("hybrid trainer async mode: a deliberately slow trainer does not hold back the other", "[rpc]") {
  auto r = runJob({"--mode", "async", "--batches", "20", "--slow-trainer", "1", "--slow-ms", "300"});
  auto [first, other_steps] = progress(r.out);
  INFO(r.out);
  CHECK(first == 0);
  // The fast trainer's 20 steps take well under the slow one's 10 x 300 ms.
  CHECK(other_steps <= 10);
  CHECK(countOf(r.out, "mode=async") == 1);

  // The synchronous (DDP) mode, by contrast, keeps the trainers in step.
  auto s = runJob({"--mode", "sync", "--batches", "6", "--slow-trainer", "1", "--slow-ms", "200"});
  auto [sync_first, sync_other] = progress(s.out);
  (void)sync_first;
  CHECK(sync_other >= 5);
}

TEST_CASE("hybrid trainer: bad usage is a one-line error and exit 2", "[rpc]") {
  auto r = run({trainer(), "--mode", "sideways"}, {}, 30s);
  CHECK(r.exit_code != 0);
  CHECK(r.exit_code != -1);
  auto three = run({ddprunPath(), "--standalone", "--nproc_per_node=3", "--term_timeout=5", "--no_python", trainer(),
                    "--batches", "1"},
                   {}, 60s);
  INFO(three.err);
  CHECK(three.exit_code == 1);
  CHECK(countOf(three.err, "needs exactly 4 workers") >= 1);
}
