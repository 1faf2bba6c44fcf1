// Checkpoint files and the checkpoint manager in one process (no process group): what was
// saved loads back bit for bit (parameters, buffers, optimizer state, progress, generator);
// a writer killed mid-save leaves the previous file intact; a damaged or foreign file is a
// clear error; the manager keeps the newest files and resumes from the newest good one.
#include "worker_runtime/checkpoint/checkpoint.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "tests/support/test_process.h"
#include "tests/trainers/checkpoint_test_model.h"

// LibTorch brings glog, whose CHECK(cond) aborts the process; Catch's CHECK must be the
// one these tests use, so it is defined last.
#undef CHECK
#include <catch2/catch.hpp>

using namespace ddprun::testing;
namespace ckpt = ddprun::checkpoint;
namespace fs = std::filesystem;

namespace {

std::string writerPath() { return binDir() + "/checkpoint_test_writer"; }

// Exact equality of every parameter and buffer, bit for bit.
bool sameState(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  auto ba = a.buffers(), bb = b.buffers();
  if (pa.size() != pb.size() || ba.size() != bb.size()) return false;
  for (size_t i = 0; i < pa.size(); ++i) {
    if (!torch::equal(pa[i], pb[i])) return false;
  }
  for (size_t i = 0; i < ba.size(); ++i) {
    if (!torch::equal(ba[i], bb[i])) return false;
  }
  return true;
}

// A few SGD-with-momentum steps (in train mode, so BatchNorm's statistics move too).
void train(CheckpointTestNet& model, torch::optim::Optimizer& opt, int steps, int seed) {
  torch::manual_seed(seed);
  for (int i = 0; i < steps; ++i) {
    auto x = torch::randn({16, 512});
    auto y = torch::randn({16, 4});
    opt.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    opt.step();
  }
}

void overwriteByte(const std::string& path, std::streamoff offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(offset);
  f.write(&c, 1);
}

std::string loadError(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer* opt = nullptr) {
  try {
    ckpt::loadFile(path, model, opt);
  } catch (const ddprun::DdprunError& e) {
    return e.what();
  }
  return "no error";
}

float firstValue(CheckpointTestNet& model) { return model->fc1->weight[0][0].item<float>(); }

// Every parameter and float buffer holds the same single value (no torn mix of versions).
bool uniform(CheckpointTestNet& model, float value) {
  for (auto& p : model->parameters()) {
    if (!torch::all(p == value).item<bool>()) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("a saved checkpoint loads back model, buffers, optimizer state, progress and generator bit for bit",
          "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("a.ckpt");
  torch::manual_seed(1);
  CheckpointTestNet model;
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  train(model, opt, 3, 7);
  torch::manual_seed(99);
  (void)torch::rand({5});  // advance the generator past its seed state
  const at::Tensor rng_before = ckpt::cpuRngState();
  const ckpt::TrainingProgress progress{
      .step = 42, .epoch = 3, .batch_in_epoch = 17, .data_seed = 0xfeedfacecafebeefULL};
  ckpt::saveFile(path, *model, &opt, progress);
  const at::Tensor expected_draw = torch::rand({8});

  // A fresh model and optimizer, differently initialised, and a different generator state.
  torch::manual_seed(2);
  CheckpointTestNet restored;
  torch::optim::SGD restored_opt(restored->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  REQUIRE_FALSE(sameState(*model, *restored));
  auto got = ckpt::load(path, *restored, &restored_opt);

  CHECK(got.step == 42);
  CHECK(got.epoch == 3);
  CHECK(got.batch_in_epoch == 17);
  CHECK(got.data_seed == 0xfeedfacecafebeefULL);
  CHECK(sameState(*model, *restored));
  CHECK(torch::equal(ckpt::cpuRngState(), rng_before));
  CHECK(torch::equal(torch::rand({8}), expected_draw));

  // The momentum buffers came back too: the same further steps give the same parameters.
  train(model, opt, 2, 11);
  train(restored, restored_opt, 2, 11);
  CHECK(sameState(*model, *restored));
}

TEST_CASE("each rank's CUDA generator states travel beside the CPU ones, and files without them still load",
          "[checkpoint]") {
  TempDir dir;
  CheckpointTestNet model;
  // What cudaRngState() gives per rank: bytes of the devices' generators (none on this host,
  // so stand-ins of the same kind: uint8, 16 bytes a device, two devices).
  const std::vector<at::Tensor> cuda_states = {at::arange(32, at::kByte), at::arange(32, at::kByte).flip(0)};
  const std::vector<at::Tensor> cpu_states = {ckpt::cpuRngState(), ckpt::cpuRngState()};
  ckpt::saveFile(dir.file("gpu.ckpt"), *model, nullptr, {}, cpu_states, cuda_states);
  auto loaded = ckpt::loadFile(dir.file("gpu.ckpt"), *model, nullptr);
  REQUIRE(loaded.cuda_rng_states.size() == 2);
  CHECK(torch::equal(loaded.cuda_rng_states[0], cuda_states[0]));
  CHECK(torch::equal(loaded.cuda_rng_states[1], cuda_states[1]));
  CHECK(loaded.rng_states.size() == 2);

  // A CPU-only saver writes no CUDA part; its file loads with none.
  ckpt::saveFile(dir.file("cpu.ckpt"), *model, nullptr, {}, {ckpt::cpuRngState()}, {ckpt::cudaRngState()});
  CHECK(ckpt::loadFile(dir.file("cpu.ckpt"), *model, nullptr).cuda_rng_states.empty());
  // Without a CUDA device there is nothing to restore a state into.
  CHECK(ckpt::cudaRngState().numel() == 0);
  CHECK_FALSE(ckpt::setCudaRngState(cuda_states[0]));
}

TEST_CASE("loading without an optimizer restores the model only, and an optimizer the file lacks is an error",
          "[checkpoint]") {
  TempDir dir;
  CheckpointTestNet model;
  fillModel(*model, 3.0f);
  ckpt::saveFile(dir.file("m.ckpt"), *model, nullptr, {});
  CheckpointTestNet other;
  ckpt::loadFile(dir.file("m.ckpt"), *other, nullptr);
  CHECK(uniform(other, 3.0f));

  torch::optim::SGD opt(other->parameters(), 0.1);
  CHECK_THAT(loadError(dir.file("m.ckpt"), *other, &opt), Catch::Contains("holds no optimizer state"));
}

TEST_CASE("a writer killed in the middle of a save leaves the previous checkpoint intact", "[checkpoint][process]") {
  TempDir dir;
  const std::string path = dir.file("model.ckpt");
  auto first = run({writerPath(), "once", path, "1"}, {}, 60s);
  REQUIRE(first.exit_code == 0);
  const auto full_size = fs::file_size(path);
  REQUIRE(full_size > 1'000'000);

  // The kernel kills the second writer with SIGXFSZ once its temporary file reaches 64 KiB.
  auto second = run({writerPath(), "once", path, "2", "65536"}, {}, 60s);
  INFO(second.err);
  REQUIRE(second.finished);
  CHECK(second.term_signal == SIGXFSZ);

  CHECK(ckpt::verifyFile(path).empty());
  CHECK(fs::file_size(path) == full_size);
  CheckpointTestNet model;
  ckpt::loadFile(path, *model, nullptr);
  CHECK(uniform(model, 1.0f));
  // What it left is a partial temporary file beside it, never the checkpoint's name.
  int partial = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    if (entry.path().filename().string().find(".model.ckpt.tmp.") == 0) {
      ++partial;
      CHECK(entry.file_size() == 65536);
    }
  }
  CHECK(partial == 1);
}

// The writer is killed at random moments of real time (the moment is the test's input):
// integration, not unit.
TEST_CASE("kill -9 at random moments of a save loop always leaves one whole version",
          "[checkpoint][process][integration]") {
  TempDir dir;
  const std::string path = dir.file("loop.ckpt");
  std::mt19937 rng(12345);
  for (int round = 0; round < 5; ++round) {
    const int base = 100 * (round + 1);
    TestProcess writer({writerPath(), "loop", path, std::to_string(base)});
    REQUIRE(writer.waitForOutput("saved " + std::to_string(base + 1), 60s));
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 20000));
    writer.signal(SIGKILL);
    REQUIRE(writer.wait(10s));
    CheckpointTestNet model;
    INFO("round " << round);
    REQUIRE(ckpt::verifyFile(path).empty());
    ckpt::loadFile(path, *model, nullptr);
    const float value = firstValue(model);
    CHECK(value >= static_cast<float>(base + 1));
    CHECK(uniform(model, value));
  }
}

TEST_CASE("damaged, truncated, foreign and missing files fail with a clear error", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("c.ckpt");
  CheckpointTestNet model;
  ckpt::saveFile(path, *model, nullptr, {});
  const auto size = fs::file_size(path);
  CheckpointTestNet target;
  fillModel(*target, 5.0f);

  SECTION("a flipped byte in the payload") {
    overwriteByte(path, static_cast<std::streamoff>(size / 2));
    CHECK_THAT(loadError(path, *target), Catch::Contains("damaged: CRC-32") && Catch::Contains(path));
    CHECK_THAT(ckpt::verifyFile(path), Catch::Contains("damaged"));
  }
  SECTION("a truncated file") {
    fs::resize_file(path, size - 100);
    CHECK_THAT(loadError(path, *target), Catch::Contains("truncated"));
  }
  SECTION("an empty file") {
    fs::resize_file(path, 0);
    CHECK_THAT(loadError(path, *target), Catch::Contains("not a ddprun checkpoint"));
  }
  SECTION("a file of something else") {
    std::ofstream(path, std::ios::trunc) << "PK\x03\x04 this is a zip file, or pretends to be";
    CHECK_THAT(loadError(path, *target), Catch::Contains("not a ddprun checkpoint"));
  }
  SECTION("a damaged header (format version)") {
    overwriteByte(path, 8);
    CHECK_THAT(loadError(path, *target), Catch::Contains("format version"));
  }
  SECTION("a missing file") {
    CHECK_THAT(loadError(dir.file("nope.ckpt"), *target),
               Catch::Contains("No such file") && Catch::Contains("nope.ckpt"));
  }
  SECTION("a checkpoint of another model names the first difference") {
    CheckpointTestNet wider(256);
    CHECK_THAT(loadError(path, *wider), Catch::Contains("made for another model") && Catch::Contains("fc1.weight") &&
                                            Catch::Contains("[512,512] in the file") &&
                                            Catch::Contains("[256,256] in the model"));
    torch::nn::Linear lone(512, 512);
    CHECK_THAT(loadError(path, *lone), Catch::Contains("made for another model"));
  }
  // Whatever failed, the model is as it was.
  CHECK(uniform(target, 5.0f));
}

TEST_CASE("a save into a missing directory fails and leaves nothing", "[checkpoint]") {
  TempDir dir;
  CheckpointTestNet model;
  const std::string path = dir.file("missing/x.ckpt");
  CHECK_THROWS_WITH(ckpt::saveFile(path, *model, nullptr, {}), Catch::Contains("checkpoint save(" + path + ")"));
  CHECK_FALSE(fs::exists(path));
}

TEST_CASE(
    "the checkpoint manager keeps the newest files, cleans dead writers' leftovers and resumes from the newest "
    "good one",
    "[checkpoint]") {
  TempDir dir;
  const std::string ckdir = dir.file("ckpts");
  ckpt::CheckpointManager manager({.directory = ckdir, .keep = 2});
  CheckpointTestNet model;
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.5));

  {
    CheckpointTestNet fresh;
    CHECK_FALSE(manager.resumeLatest(*fresh, nullptr).has_value());  // the directory does not even exist
  }
  for (int step = 10; step <= 40; step += 10) {
    fillModel(*model, static_cast<float>(step));
    if (step == 30) std::ofstream(ckdir + "/.checkpoint_000000000030.ckpt.tmp.999999") << "partial";
    manager.save(*model, &opt, {.step = step, .epoch = step / 20});
  }
  auto files = manager.list();
  REQUIRE(files.size() == 2);
  CHECK(files[0] == manager.pathFor(30));
  CHECK(files[1] == manager.pathFor(40));
  int temps = 0;
  for (const auto& entry : fs::directory_iterator(ckdir)) temps += entry.path().filename().string()[0] == '.';
  CHECK(temps == 0);

  CheckpointTestNet resumed;
  torch::optim::SGD resumed_opt(resumed->parameters(), torch::optim::SGDOptions(0.1).momentum(0.5));
  auto progress = manager.resumeLatest(*resumed, &resumed_opt);
  REQUIRE(progress.has_value());
  CHECK(progress->step == 40);
  CHECK(progress->epoch == 2);
  CHECK(uniform(resumed, 40.0f));

  // A damaged newest file is skipped in favour of the one before it.
  overwriteByte(manager.pathFor(40), 1000);
  progress = manager.resumeLatest(*resumed, &resumed_opt);
  REQUIRE(progress.has_value());
  CHECK(progress->step == 30);
  CHECK(uniform(resumed, 30.0f));

  CHECK_THROWS_AS(ckpt::CheckpointManager({.directory = ckdir, .keep = 0}), ddprun::UsageError);
  CHECK_THROWS_AS(ckpt::CheckpointManager({.directory = ""}), ddprun::UsageError);
}

TEST_CASE("huge sparse files among the checkpoints cost their header, not their size, and are skipped",
          "[checkpoint]") {
  TempDir dir;
  const std::string ckdir = dir.file("ckpts");
  ckpt::CheckpointManager manager({.directory = ckdir, .keep = 5});
  CheckpointTestNet model;
  fillModel(*model, 10.0f);
  manager.save(*model, nullptr, {.step = 10});
  constexpr uintmax_t kHuge = uintmax_t{16} << 30;  // 16 GiB apparent, a few KB on disk
  // Newer than the good one: a file of zeros, and a real header padded out to 16 GiB.
  { std::ofstream(manager.pathFor(20)); }
  fs::resize_file(manager.pathFor(20), kHuge);
  fs::copy_file(manager.pathFor(10), manager.pathFor(30));
  fs::resize_file(manager.pathFor(30), kHuge);

  // Allocating either file's size would fail under this limit (the loader once did, and
  // std::bad_alloc escaped resumeLatest).
  struct rlimit old_limit {};
  REQUIRE(::getrlimit(RLIMIT_AS, &old_limit) == 0);
  long pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  struct rlimit limit = old_limit;
  limit.rlim_cur = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + (rlim_t{4} << 30);
  REQUIRE(::setrlimit(RLIMIT_AS, &limit) == 0);
  std::optional<ckpt::TrainingProgress> progress;
  std::string error;
  try {
    CheckpointTestNet resumed;
    progress = manager.resumeLatest(*resumed, nullptr);
    if (progress) CHECK(uniform(resumed, 10.0f));
  } catch (const std::exception& e) {
    error = e.what();
  }
  ::setrlimit(RLIMIT_AS, &old_limit);
  CHECK(error.empty());
  REQUIRE(progress.has_value());
  CHECK(progress->step == 10);
  CHECK_THAT(ckpt::verifyFile(manager.pathFor(20)), Catch::Contains("not a ddprun checkpoint"));
  CHECK_THAT(ckpt::verifyFile(manager.pathFor(30)), Catch::Contains("truncated or padded"));
}
