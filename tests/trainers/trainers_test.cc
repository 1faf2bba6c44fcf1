// The trainers end to end, through the real ddprun binary with two workers: the DDP
// tutorial examples end with the same parameters on every rank although every rank
// started from its own random model and data; the Fashion-MNIST trainer learns; and a
// worker crashing mid-run under --max_restarts=1 resumes from the newest checkpoint and
// ends with parameters bitwise equal to a run that never crashed.
#include <catch2/catch.hpp>
#include <filesystem>
#include <regex>

#include "tests/support/test_process.h"

using namespace ddprun::testing;
namespace fs = std::filesystem;

namespace {

std::string tail(const std::string& text, size_t bytes = 3000) {
  return text.size() <= bytes ? text : "..." + text.substr(text.size() - bytes);
}

RunResult runTrainer(const std::vector<std::string>& trainer_args, const std::map<std::string, std::string>& env = {},
                     const std::vector<std::string>& ddprun_args = {}) {
  std::vector<std::string> argv = {ddprunPath(), "--standalone", "--nproc_per_node=2", "--term_timeout=5"};
  argv.insert(argv.end(), ddprun_args.begin(), ddprun_args.end());
  argv.push_back("--no_python");
  argv.insert(argv.end(), trainer_args.begin(), trainer_args.end());
  std::map<std::string, std::string> full_env = {{"OMP_NUM_THREADS", "1"}};
  full_env.insert(env.begin(), env.end());
  return run(argv, full_env, 150s);
}

std::string readBytes(const std::string& path) {
  REQUIRE(fileExists(path));
  return readFile(path);
}

// Fashion-MNIST, cut down so a run takes seconds: 2048 training samples (1024 per rank,
// 32 steps of 32 per epoch), 2 epochs, 1000 test samples.
std::vector<std::string> smallFashionRun(const std::string& dir) {
  return {binDir() + "/fashion_mnist",
          "--train-limit",
          "2048",
          "--test-limit",
          "1000",
          "--epochs",
          "2",
          "--log-every",
          "8",
          "--checkpoint-dir",
          dir + "/ckpt",
          "--checkpoint-every",
          "15",
          "--dump-params",
          dir + "/params"};
}

}  // namespace

TEST_CASE("the DDP tutorial examples end with the same parameters on every rank", "[trainers]") {
  const std::string demo = GENERATE(as<std::string>{}, "basic", "checkpoint", "model_parallel");
  TempDir dir;
  const std::string checkpoint = dir.file("toy.ckpt");
  auto r = runTrainer(
      {binDir() + "/ddp_tutorial", demo, "--steps", "5", "--dump-params", dir.path(), "--checkpoint-path", checkpoint});
  INFO(demo << "\nstdout:\n" << tail(r.out) << "\nstderr:\n" << tail(r.err));
  REQUIRE(r.finished);
  REQUIRE(r.exit_code == 0);
  CHECK(countOf(r.out, demo + " done, params") == 2);
  // Each rank seeded its model and data with its rank: equal bytes mean DDP broadcast the
  // model and averaged every gradient.
  const std::string rank0 = readBytes(dir.file("params_rank0.bin"));
  const std::string rank1 = readBytes(dir.file("params_rank1.bin"));
  CHECK(rank0.size() == (10 * 10 + 10 + 10 * 5 + 5) * sizeof(float));
  CHECK(rank0 == rank1);
  if (demo == "checkpoint") CHECK_FALSE(fs::exists(checkpoint));  // rank 0 removes it
}

TEST_CASE("the Fashion-MNIST trainer learns", "[trainers]") {
  TempDir dir;
  // One epoch of 6400 samples (100 steps of 64), a progress line every 20 steps.
  auto r = runTrainer({binDir() + "/fashion_mnist", "--train-limit", "6400", "--test-limit", "2000", "--epochs", "1",
                       "--log-every", "20"});
  INFO("stdout:\n" << tail(r.out) << "\nstderr:\n" << tail(r.err));
  REQUIRE(r.finished);
  REQUIRE(r.exit_code == 0);

  static const std::regex kStep(R"(step (\d+)/100 \[[#.]+\] +\d+% loss ([0-9.]+) +(\d+) samples/s +ETA)");
  std::vector<double> losses;
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), kStep), end; it != end; ++it) {
    losses.push_back(std::stod((*it)[2].str()));
    CHECK(std::stoll((*it)[3].str()) > 0);
  }
  REQUIRE(losses.size() == 5);  // steps 20, 40, 60, 80, 100: rank 0 only, no terminal
  INFO("mean losses per 20 steps: " << losses[0] << " ... " << losses[4]);
  CHECK(losses[0] > 1.0);              // starts near chance (ln 10 = 2.3)
  CHECK(losses[4] < 0.6 * losses[0]);  // and falls clearly
  std::smatch m;
  static const std::regex kAccuracy(R"(epoch 1/1: .*test accuracy ([0-9.]+)% \(2000 samples\))");
  REQUIRE(std::regex_search(r.out, m, kAccuracy));
  CHECK(std::stod(m[1].str()) > 60.0);  // chance is 10%
}

TEST_CASE("a worker that crashes mid-run resumes from the checkpoint and ends bitwise equal to an uninterrupted run",
          "[trainers]") {
  TempDir clean_dir;
  auto clean = runTrainer(smallFashionRun(clean_dir.path()), {}, {"--max_restarts=1"});
  INFO("uninterrupted stdout:\n" << tail(clean.out) << "\nstderr:\n" << tail(clean.err));
  REQUIRE(clean.finished);
  REQUIRE(clean.exit_code == 0);
  CHECK(countOf(clean.out, "resumed at step") == 0);
  CHECK(countOf(clean.out, "epoch 2/2:") == 1);
  const std::string expected = readBytes(clean_dir.file("params/params_rank0.bin"));
  CHECK(readBytes(clean_dir.file("params/params_rank1.bin")) == expected);

  // 32 steps per epoch, checkpoints every 15 steps. Rank 1 crashing before step 40 resumes
  // from step 30, the last two batches of epoch 1, across the end-of-epoch evaluation;
  // rank 0 (the one that writes checkpoints) crashing before step 5 finds no checkpoint
  // and starts over.
  struct Crash {
    int at, rank, resumed_at;
  };
  for (const Crash& crash : {Crash{40, 1, 30}, Crash{5, 0, 0}}) {
    const int crash_at = crash.at;
    const int resumed_at = crash.resumed_at;
    TempDir dir;
    auto crashed = runTrainer(
        smallFashionRun(dir.path()),
        {{"DDPRUN_CRASH_AT_STEP", std::to_string(crash_at)}, {"DDPRUN_CRASH_RANK", std::to_string(crash.rank)}},
        {"--max_restarts=1"});
    INFO("crash at " << crash_at << "\nstdout:\n" << tail(crashed.out) << "\nstderr:\n" << tail(crashed.err));
    REQUIRE(crashed.finished);
    REQUIRE(crashed.exit_code == 0);
    CHECK(countOf(crashed.err, "fault injection: rank " + std::to_string(crash.rank) + " exits before step " +
                                   std::to_string(crash_at)) == 1);
    CHECK(countOf(crashed.err, "restart 1") >= 1);
    if (resumed_at > 0) {
      CHECK(countOf(crashed.out, "resumed at step " + std::to_string(resumed_at) + " ") == 1);
    } else {
      CHECK(countOf(crashed.out, "resumed at step") == 0);
    }
    CHECK(countOf(crashed.out, "epoch 2/2:") == 1);
    // Bit for bit: model, momentum, data order and schedule all continued exactly.
    CHECK(readBytes(dir.file("params/params_rank0.bin")) == expected);
    CHECK(readBytes(dir.file("params/params_rank1.bin")) == expected);
    // The checkpoint manager kept the newest two.
    int checkpoints = 0;
    for (const auto& entry : fs::directory_iterator(dir.file("ckpt")))
      checkpoints += entry.path().extension() == ".ckpt";
    CHECK(checkpoints == 2);
  }
}

TEST_CASE("the trainers reject bad input with a clear error", "[trainers]") {
  TempDir dir;
  auto missing = runTrainer({binDir() + "/fashion_mnist", "--data-dir", dir.file("nowhere")});
  INFO(tail(missing.out) << tail(missing.err));
  REQUIRE(missing.finished);
  CHECK(missing.exit_code == 1);
  CHECK(countOf(missing.err, "fashion-mnist: cannot open " + dir.file("nowhere") + "/train-images-idx3-ubyte.gz") >= 1);

  auto odd_batch = runTrainer({binDir() + "/fashion_mnist", "--batch-size", "63"});
  REQUIRE(odd_batch.finished);
  CHECK(odd_batch.exit_code == 1);
  CHECK(countOf(odd_batch.err, "--batch-size 63 is not a multiple of the 2 ranks") >= 1);

  // The demo's guard: a run that falls short of --min-accuracy fails.
  auto short_run = runTrainer({binDir() + "/fashion_mnist", "--train-limit", "640", "--test-limit", "500", "--epochs",
                               "1", "--min-accuracy", "99"});
  REQUIRE(short_run.finished);
  CHECK(short_run.exit_code == 1);
  CHECK(countOf(short_run.err, "is below --min-accuracy 99.00%") >= 1);

  auto bad_demo = run({binDir() + "/ddp_tutorial", "nonsense"}, {}, 30s);
  REQUIRE(bad_demo.finished);
  CHECK(bad_demo.exit_code != 0);
  CHECK(countOf(bad_demo.err, "nonsense") >= 1);
}
