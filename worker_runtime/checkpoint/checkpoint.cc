#include "worker_runtime/checkpoint/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <regex>
#include <sstream>

#include "common/error.h"
#include "common/logging.h"
#include "common/unique_fd.h"

namespace ddprun::checkpoint {
namespace {

namespace fs = std::filesystem;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

// File layout: a 32-byte header, then LibTorch's archive (a zip, as torch.save writes).
//   0  "DDPRUNCK"   magic
//   8  u32          format version
//  12  u32          CRC-32 of the payload
//  16  u64          payload size in bytes
//  24  u64          reserved (0)
// All integers little-endian. The CRC and size make truncation and damage detectable
// before LibTorch's parser sees the bytes (it would otherwise fail deep inside, or not at all).
constexpr std::array<char, 8> kMagic = {'D', 'D', 'P', 'R', 'U', 'N', 'C', 'K'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderSize = 32;

void putLe(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t getLe(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return value;
}

uint32_t crc32Of(const char* data, size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths: feed large payloads in slices.
  constexpr size_t kSlice = size_t{1} << 30;
  for (size_t done = 0; done < size; done += kSlice) {
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data + done), static_cast<uInt>(std::min(kSlice, size - done)));
  }
  return static_cast<uint32_t>(crc);
}

std::string headerFor(const std::string& payload) {
  std::string header(kMagic.begin(), kMagic.end());
  putLe(header, kFormatVersion, 4);
  putLe(header, crc32Of(payload.data(), payload.size()), 4);
  putLe(header, payload.size(), 8);
  putLe(header, 0, 8);
  return header;
}

// Throws SystemError with errno as it was before the message was built (building it
// allocates, and allocation may change errno).
#define DDPRUN_CKPT_THROW_ERRNO(what) \
  do {                                \
    const int err_ = errno;           \
    throw SystemError((what), err_);  \
  } while (0)

void writeAll(int fd, const char* data, size_t size, const std::string& what) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      DDPRUN_CKPT_THROW_ERRNO(what);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Temporary files are ".<name>.tmp.<pid>" next to the target: same file system, so the
// rename is atomic, and a name no reader of checkpoint_*.ckpt ever picks up.
std::string tempPathFor(const fs::path& target) {
  return (target.parent_path() / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
}

void writeFileAtomically(const std::string& path, const std::string& header, const std::string& payload) {
  const fs::path target(path);
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string temp = tempPathFor(target.parent_path().empty() ? fs::path(".") / target : target);
  const std::string op = "checkpoint save(" + path + ")";

  UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) DDPRUN_CKPT_THROW_ERRNO(op + ": create " + temp);
  try {
    writeAll(fd.get(), header.data(), header.size(), op + ": write " + temp);
    writeAll(fd.get(), payload.data(), payload.size(), op + ": write " + temp);
    if (::fsync(fd.get()) != 0) DDPRUN_CKPT_THROW_ERRNO(op + ": fsync " + temp);
    // close can report a write the file system deferred (NFS, quotas): it is checked.
    if (const int err = fd.close(); err != 0) throw SystemError(op + ": close " + temp, err);
    if (::rename(temp.c_str(), path.c_str()) != 0) DDPRUN_CKPT_THROW_ERRNO(op + ": rename " + temp);
  } catch (...) {
    fd.reset();
    ::unlink(temp.c_str());
    throw;
  }
  // The rename is durable only once the directory entry is: without this a power loss
  // could bring back the old name (or none) after the caller was told the save happened.
  const UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd) DDPRUN_CKPT_THROW_ERRNO(op + ": open directory " + dir.string());
  if (::fsync(dir_fd.get()) != 0) DDPRUN_CKPT_THROW_ERRNO(op + ": fsync directory " + dir.string());
}

// Reads exactly `size` bytes at the current offset of fd into out (resized to what was read).
void readFully(int fd, std::string& out, size_t size, const std::string& op) {
  out.resize(size);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd, out.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) DDPRUN_CKPT_THROW_ERRNO(op + ": read");
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out.resize(done);
}

// Checks the header, then reads the payload; returns it or throws DdprunError. Nothing is
// allocated for the payload until the header has been found good and its size matches the
// file's: a huge sparse or foreign file costs 32 bytes, not its apparent size.
std::string readPayload(const std::string& path) {
  const std::string op = "checkpoint load(" + path + ")";
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) DDPRUN_CKPT_THROW_ERRNO(op + ": open");
  std::string header;
  std::string bytes;
  uint64_t file_size = 0;
  uint32_t crc = 0;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) DDPRUN_CKPT_THROW_ERRNO(op + ": stat");
  file_size = static_cast<uint64_t>(st.st_size);
  readFully(fd.get(), header, kHeaderSize, op);
  if (header.size() < kHeaderSize || !std::equal(kMagic.begin(), kMagic.end(), header.begin())) {
    throw DdprunError(op + ": not a ddprun checkpoint (" + std::to_string(file_size) + " bytes, no DDPRUNCK header)");
  }
  const auto version = static_cast<uint32_t>(getLe(header.data() + 8, 4));
  if (version != kFormatVersion) {
    throw DdprunError(op + ": format version " + std::to_string(version) + ", this build reads " +
                      std::to_string(kFormatVersion));
  }
  crc = static_cast<uint32_t>(getLe(header.data() + 12, 4));
  const uint64_t size = getLe(header.data() + 16, 8);
  if (size != file_size - kHeaderSize) {
    throw DdprunError(op + ": truncated or padded: header says " + std::to_string(size) +
                      " bytes of payload, file has " + std::to_string(file_size - kHeaderSize));
  }
  try {
    readFully(fd.get(), bytes, static_cast<size_t>(size), op);
  } catch (const std::bad_alloc&) {
    throw DdprunError(op + ": its " + std::to_string(size) + "-byte payload does not fit in memory");
  }
  if (bytes.size() != size) {
    throw DdprunError(op + ": truncated while reading: " + std::to_string(bytes.size()) + " of " +
                      std::to_string(size) + " bytes of payload");
  }
  fd.reset();
  const uint32_t actual = crc32Of(bytes.data(), bytes.size());
  if (actual != crc) {
    char detail[96];
    std::snprintf(detail, sizeof detail, ": damaged: CRC-32 %08x, header says %08x", actual, crc);
    throw DdprunError(op + detail);
  }
  return bytes;
}

std::string joinLines(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) {
    if (!out.empty()) out += '\n';
    out += name;
  }
  return out;
}

std::vector<std::string> splitLines(const std::string& text) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::string shapeOf(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? "," : "") + std::to_string(t.size(d));
  return s + "]";
}

// Tensors are stored under short positional keys ("t0", "t1", ...) with the names in one
// string: LibTorch archives reject keys with dots, and module names have them.
void writeTensors(OutputArchive& archive, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::vector<std::string> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    names.push_back(tensors[i].first);
    archive.write("t" + std::to_string(i), tensors[i].second.detach());
  }
  archive.write("names", c10::IValue(joinLines(names)));
}

// Generator states, one per rank, as part `part` of `root` (writeTensors' layout).
void writeStates(OutputArchive& root, const char* part, const std::vector<at::Tensor>& states) {
  OutputArchive archive(root.compilation_unit());
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (size_t i = 0; i < states.size(); ++i) named.emplace_back("rank" + std::to_string(i), states[i]);
  writeTensors(archive, named);
  root.write(part, archive);
}

// The generator states of a part writeStates() wrote, one per rank, on the CPU.
std::vector<at::Tensor> readStates(InputArchive& archive) {
  c10::IValue names;
  archive.read("names", names);
  const size_t count = splitLines(names.toStringRef()).size();
  std::vector<at::Tensor> states;
  for (size_t i = 0; i < count; ++i) {
    at::Tensor state;
    archive.read("t" + std::to_string(i), state, /*is_buffer=*/false);
    states.push_back(state.to(at::kCPU));
  }
  return states;
}

// Reads and checks the tensors for `expected` (name, tensor) in order; returns them.
std::vector<at::Tensor> readTensors(InputArchive& archive,
                                    const std::vector<std::pair<std::string, at::Tensor>>& expected,
                                    const std::string& op, const char* kind) {
  c10::IValue names_value;
  archive.read("names", names_value);
  const std::vector<std::string> names = splitLines(names_value.toStringRef());
  if (names.size() != expected.size()) {
    throw DdprunError(op + ": made for another model: " + std::to_string(names.size()) + " " + kind +
                      "s in the file, " + std::to_string(expected.size()) + " in the model");
  }
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& [name, want] = expected[i];
    if (names[i] != name) {
      throw DdprunError(op + ": made for another model: " + kind + " " + std::to_string(i) + " is '" + names[i] +
                        "' in the file, '" + name + "' in the model");
    }
    at::Tensor t;
    archive.read("t" + std::to_string(i), t, /*is_buffer=*/false);
    if (!t.sizes().equals(want.sizes()) || t.scalar_type() != want.scalar_type()) {
      throw DdprunError(op + ": made for another model: " + kind + " '" + name + "' is " +
                        std::string(c10::toString(t.scalar_type())) + shapeOf(t) + " in the file, " +
                        std::string(c10::toString(want.scalar_type())) + shapeOf(want) + " in the model");
    }
    out.push_back(t);
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> namedParameters(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> namedBuffers(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_buffers(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  return out;
}

int64_t readInt(InputArchive& archive, const std::string& key) {
  c10::IValue value;
  archive.read(key, value);
  return value.toInt();
}

// LibTorch's errors carry a C++ backtrace after the first line; the message needs only that.
std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

struct GroupView {
  bool distributed = false;
  int rank = 0;
  int size = 1;
};

GroupView viewOf(const dist::Group& group) {
  if (!dist::is_initialized()) return {};
  return {true, dist::get_rank(group), dist::get_world_size(group)};
}

// Every rank's `state` (equal sizes), gathered over the group on its default device.
std::vector<at::Tensor> gatherStates(const at::Tensor& state, const dist::Group& group, int size) {
  const at::Device device = dist::get_default_device(group);
  at::Tensor mine = state.to(device);
  std::vector<at::Tensor> gathered;
  for (int i = 0; i < size; ++i) gathered.push_back(at::empty_like(mine));
  dist::all_gather(gathered, mine, group);
  for (auto& g : gathered) g = g.cpu();
  return gathered;
}

}  // namespace

at::Tensor cpuRngState() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void setCpuRngState(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state.to(at::kCPU));
}

// Through at::Context's device-generic generators, so this file needs no CUDA headers (and a
// CPU-only LibTorch reports no device).
at::Tensor cudaRngState() {
  const auto devices = static_cast<int>(at::getNumGPUs());
  std::vector<at::Tensor> states;
  for (int d = 0; d < devices; ++d) {
    at::Generator gen = at::globalContext().defaultGenerator(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(d)));
    std::lock_guard<std::mutex> lock(gen.mutex());
    states.push_back(gen.get_state());
  }
  return states.empty() ? at::empty({0}, at::kByte) : at::cat(states);
}

bool setCudaRngState(const at::Tensor& state) {
  const auto devices = static_cast<int>(at::getNumGPUs());
  if (devices == 0 || state.numel() == 0 || state.numel() % devices != 0) return false;
  const int64_t each = state.numel() / devices;
  for (int d = 0; d < devices; ++d) {
    at::Generator gen = at::globalContext().defaultGenerator(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(d)));
    std::lock_guard<std::mutex> lock(gen.mutex());
    if (gen.get_state().numel() != each) return false;
    gen.set_state(state.narrow(0, d * each, each).to(at::kCPU).contiguous());
  }
  return true;
}

void saveFile(const std::string& path, const torch::nn::Module& model, const torch::optim::Optimizer* optimizer,
              const TrainingProgress& progress, const std::vector<at::Tensor>& rng_states,
              const std::vector<at::Tensor>& cuda_rng_states) {
  const auto start = std::chrono::steady_clock::now();
  OutputArchive root;
  root.write("format", c10::IValue(int64_t{kFormatVersion}));

  OutputArchive parameters(root.compilation_unit());
  writeTensors(parameters, namedParameters(model));
  root.write("parameters", parameters);
  OutputArchive buffers(root.compilation_unit());
  writeTensors(buffers, namedBuffers(model));
  root.write("buffers", buffers);

  root.write("has_optimizer", c10::IValue(optimizer != nullptr));
  if (optimizer != nullptr) {
    OutputArchive state(root.compilation_unit());
    optimizer->save(state);
    root.write("optimizer", state);
  }

  root.write("step", c10::IValue(progress.step));
  root.write("epoch", c10::IValue(progress.epoch));
  root.write("batch_in_epoch", c10::IValue(progress.batch_in_epoch));
  root.write("data_seed", c10::IValue(static_cast<int64_t>(progress.data_seed)));

  writeStates(root, "rng", rng_states);
  // Beside the CPU ones, where the ranks have CUDA generators (an optional part: files without
  // it still load).
  if (!cuda_rng_states.empty() && cuda_rng_states.front().numel() > 0) writeStates(root, "cuda_rng", cuda_rng_states);

  std::string payload;
  root.save_to([&payload](const void* data, size_t size) {
    payload.append(static_cast<const char*>(data), size);
    return size;
  });
  writeFileAtomically(path, headerFor(payload), payload);
  logger("checkpoint")
      ->debug("saved step {} to {} ({} bytes, {} ms)", progress.step, path, payload.size() + kHeaderSize,
              std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count());
}

LoadedCheckpoint loadFile(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                          torch::Device map_location) {
  const std::string op = "checkpoint load(" + path + ")";
  const std::string payload = readPayload(path);
  LoadedCheckpoint loaded;
  try {
    InputArchive root;
    root.load_from(payload.data(), payload.size(), map_location);

    InputArchive parameters;
    root.read("parameters", parameters);
    const auto params = namedParameters(model);
    const auto param_values = readTensors(parameters, params, op, "parameter");
    InputArchive buffers;
    root.read("buffers", buffers);
    const auto bufs = namedBuffers(model);
    const auto buffer_values = readTensors(buffers, bufs, op, "buffer");

    c10::IValue has_optimizer;
    root.read("has_optimizer", has_optimizer);
    if (optimizer != nullptr && !has_optimizer.toBool()) {
      throw DdprunError(op + ": the file holds no optimizer state, and an optimizer was given to restore");
    }

    loaded.progress.step = readInt(root, "step");
    loaded.progress.epoch = readInt(root, "epoch");
    loaded.progress.batch_in_epoch = readInt(root, "batch_in_epoch");
    loaded.progress.data_seed = static_cast<uint64_t>(readInt(root, "data_seed"));
    InputArchive rng;
    root.read("rng", rng);
    loaded.rng_states = readStates(rng);
    InputArchive cuda_rng;
    if (root.try_read("cuda_rng", cuda_rng)) loaded.cuda_rng_states = readStates(cuda_rng);

    // Everything about the model checked: now change it, copying so each parameter keeps
    // its own device (a model spread over two devices stays spread).
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) params[i].second.copy_(param_values[i]);
      for (size_t i = 0; i < bufs.size(); ++i) bufs[i].second.copy_(buffer_values[i]);
    }
    if (optimizer != nullptr) {
      InputArchive state;
      root.read("optimizer", state);
      optimizer->load(state);
    }
  } catch (const DdprunError&) {
    throw;
  } catch (const std::exception& e) {
    throw DdprunError(op + ": unreadable: " + firstLine(e.what()));
  }
  return loaded;
}

std::string verifyFile(const std::string& path) {
  // Any failure to read a candidate (not only a bad header: an I/O error, no memory) means
  // "skip it"; resuming then falls back to the next older checkpoint.
  try {
    readPayload(path);
    return {};
  } catch (const std::exception& e) {
    return e.what();
  }
}

void save(const std::string& path, const torch::nn::Module& model, const torch::optim::Optimizer* optimizer,
          const TrainingProgress& progress, const dist::Group& group) {
  const GroupView view = viewOf(group);
  std::vector<at::Tensor> rng_states = {cpuRngState()};
  std::vector<at::Tensor> cuda_rng_states = {cudaRngState()};
  if (view.distributed && view.size > 1) {
    rng_states = gatherStates(rng_states[0], group, view.size);
    // Every rank of a job sees the same number of devices, or none: the gathered sizes match.
    if (cuda_rng_states[0].numel() > 0) cuda_rng_states = gatherStates(cuda_rng_states[0], group, view.size);
  }
  if (view.rank == 0) saveFile(path, model, optimizer, progress, rng_states, cuda_rng_states);
  if (view.distributed) dist::barrier(group);
}

TrainingProgress load(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                      torch::Device map_location, const dist::Group& group) {
  const GroupView view = viewOf(group);
  LoadedCheckpoint loaded = loadFile(path, model, optimizer, map_location);
  if (loaded.cuda_rng_states.size() == static_cast<size_t>(view.size) &&
      !setCudaRngState(loaded.cuda_rng_states[static_cast<size_t>(view.rank)])) {
    logger("checkpoint")->warn("{} holds CUDA generator states for another number of devices: not restored", path);
  }
  if (loaded.rng_states.size() == static_cast<size_t>(view.size)) {
    setCpuRngState(loaded.rng_states[static_cast<size_t>(view.rank)]);
  } else {
    logger("checkpoint")
        ->warn("{} holds generator states for {} ranks, this group has {}: generator not restored", path,
               loaded.rng_states.size(), view.size);
  }
  return loaded.progress;
}

CheckpointManager::CheckpointManager(CheckpointManagerOptions options) : options_(std::move(options)) {
  if (options_.directory.empty()) throw UsageError("checkpoint manager: empty directory");
  if (options_.keep < 1)
    throw UsageError("checkpoint manager: keep must be >= 1, got " + std::to_string(options_.keep));
}

std::string CheckpointManager::pathFor(int64_t step) const {
  char name[64];
  std::snprintf(name, sizeof name, "checkpoint_%012lld.ckpt", static_cast<long long>(step));
  return (fs::path(options_.directory) / name).string();
}

std::vector<std::string> CheckpointManager::list() const {
  static const std::regex kName(R"(checkpoint_(\d+)\.ckpt)");
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(options_.directory, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, kName)) found.emplace_back(std::stoll(m[1].str()), entry.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

std::string CheckpointManager::save(const torch::nn::Module& model, const torch::optim::Optimizer* optimizer,
                                    const TrainingProgress& progress) {
  const GroupView view = viewOf(options_.group);
  const std::string path = pathFor(progress.step);
  if (view.rank == 0) {
    std::error_code ec;
    fs::create_directories(options_.directory, ec);
    if (ec) throw DdprunError("checkpoint save(" + path + "): create directory: " + ec.message());
  }
  checkpoint::save(path, model, optimizer, progress, options_.group);
  if (view.rank != 0) return path;

  // Only rank 0 writes, so only it cleans up: checkpoints beyond `keep`, and temporary
  // files of writers that died mid-save (any pid but ours: one job per directory).
  auto all = list();
  for (size_t i = 0; i + static_cast<size_t>(options_.keep) < all.size(); ++i) {
    std::error_code ec;
    fs::remove(all[i], ec);
  }
  const std::string own_suffix = ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(options_.directory, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".checkpoint_", 0) == 0 && name.find(".ckpt.tmp.") != std::string::npos &&
        name.find(own_suffix) == std::string::npos) {
      std::error_code ignored;
      fs::remove(entry.path(), ignored);
    }
  }
  return path;
}

std::optional<TrainingProgress> CheckpointManager::resumeLatest(torch::nn::Module& model,
                                                                torch::optim::Optimizer* optimizer) {
  const GroupView view = viewOf(options_.group);
  int64_t chosen = -1;
  if (view.rank == 0) {
    static const std::regex kName(R"(.*checkpoint_(\d+)\.ckpt)");
    auto all = list();
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      const std::string problem = verifyFile(*it);
      if (problem.empty()) {
        std::smatch m;
        std::regex_match(*it, m, kName);
        chosen = std::stoll(m[1].str());
        break;
      }
      logger("checkpoint")->warn("skipping {}", problem);
    }
  }
  if (view.distributed && view.size > 1) {
    // The group's rank 0 decides, so every rank loads the same step even if a save was
    // racing with the directory scan. Its global rank comes from an all_gather: broadcast
    // takes global ranks.
    const auto on = at::TensorOptions().dtype(at::kLong).device(dist::get_default_device(options_.group));
    std::vector<at::Tensor> globals;
    for (int i = 0; i < view.size; ++i) globals.push_back(at::empty({1}, on));
    dist::all_gather(globals, at::full({1}, static_cast<int64_t>(dist::get_rank()), on), options_.group);
    at::Tensor decided = at::full({1}, chosen, on);
    dist::broadcast(decided, static_cast<int>(globals[0].item<int64_t>()), options_.group);
    chosen = decided.item<int64_t>();
  }
  if (chosen < 0) return std::nullopt;
  const std::string path = pathFor(chosen);
  TrainingProgress progress = load(path, model, optimizer, options_.map_location, options_.group);
  if (view.rank == 0) {
    logger("checkpoint")
        ->info("resumed from {} (step {}, epoch {}, batch {})", path, progress.step, progress.epoch,
               progress.batch_in_epoch);
  }
  return progress;
}

}  // namespace ddprun::checkpoint
