// The archive inside a checkpoint file (checkpoint.h): LibTorch's, as torch.save writes, with
// the model's parameters and buffers, the optimizer's state, the training progress and the
// ranks' generator states; saveFile and loadFile.
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <chrono>
#include <sstream>

#include "common/error.h"
#include "common/logging.h"
#include "worker_runtime/checkpoint/archive_impl.h"
#include "worker_runtime/checkpoint/checkpoint.h"
#include "worker_runtime/checkpoint/framing_impl.h"

namespace ddprun::checkpoint {
namespace {

using detail::kFormatVersion;
using detail::kHeaderSize;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

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

}  // namespace

std::string detail::archiveBytes(const torch::nn::Module& model, const torch::optim::Optimizer* optimizer,
                                 const TrainingProgress& progress, const std::vector<at::Tensor>& rng_states,
                                 const std::vector<at::Tensor>& cuda_rng_states) {
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
  return payload;
}

void saveFile(const std::string& path, const torch::nn::Module& model, const torch::optim::Optimizer* optimizer,
              const TrainingProgress& progress, const std::vector<at::Tensor>& rng_states,
              const std::vector<at::Tensor>& cuda_rng_states) {
  const auto start = std::chrono::steady_clock::now();
  const std::string payload = detail::archiveBytes(model, optimizer, progress, rng_states, cuda_rng_states);
  detail::writeFileAtomically(path, detail::headerFor(payload), payload);
  logger("checkpoint")
      ->debug("saved step {} to {} ({} bytes, {} ms)", progress.step, path, payload.size() + kHeaderSize,
              std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count());
}

LoadedCheckpoint loadFile(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                          torch::Device map_location) {
  return detail::loadArchive(detail::readPayload(path), "checkpoint load(" + path + ")", model, optimizer,
                             map_location);
}

LoadedCheckpoint detail::loadArchive(const std::string& payload, const std::string& op, torch::nn::Module& model,
                                     torch::optim::Optimizer* optimizer, torch::Device map_location) {
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

}  // namespace ddprun::checkpoint
