#include "worker_runtime/backend/backend_spec.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "common/error.h"

namespace ddprun::runtime {
namespace {

constexpr std::string_view kKnown = "auto, gloo, cpu, nccl, or per device as in \"cpu:gloo,cuda:nccl\"";

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

// One backend name of the per-device form, for `device` ("cpu" or "cuda").
DeviceBackend deviceBackend(std::string_view whole, std::string_view device, std::string_view name) {
  if (name == "gloo" || name == "cpu") return DeviceBackend::kHost;
  if (name == "nccl") {
    if (device == "cpu") {
      throw UsageError(fmt::format("backend '{}': NCCL runs CUDA tensors only; CPU tensors need gloo", whole));
    }
    return DeviceBackend::kNccl;
  }
  throw UsageError(fmt::format("backend '{}': '{}' is not a backend here (gloo, cpu, nccl)", whole, name));
}

}  // namespace

BackendSpec parseBackendSpec(std::string_view text) {
  const std::string whole = lower(text);
  if (whole == "auto" || whole.empty()) return BackendSpec{DeviceBackend::kHost, DeviceBackend::kNcclIfViable};
  if (whole == "gloo" || whole == "cpu") return BackendSpec{DeviceBackend::kHost, DeviceBackend::kHost};
  if (whole == "nccl") return BackendSpec{DeviceBackend::kNone, DeviceBackend::kNccl};
  if (whole.find(':') == std::string::npos) {
    throw UsageError(fmt::format("backend '{}' is not available (use {})", text, kKnown));
  }
  // The per-device form: a device left out has no backend, as in torch.
  BackendSpec spec{DeviceBackend::kNone, DeviceBackend::kNone};
  bool seen_cpu = false, seen_cuda = false;
  std::string_view rest = whole;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view entry = rest.substr(0, comma);
    const size_t colon = entry.find(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == entry.size()) {
      throw UsageError(fmt::format("backend '{}': entry '{}' is not device:backend", text, entry));
    }
    const std::string_view device = entry.substr(0, colon);
    const std::string_view name = entry.substr(colon + 1);
    bool* seen = device == "cpu" ? &seen_cpu : device == "cuda" ? &seen_cuda : nullptr;
    if (!seen) throw UsageError(fmt::format("backend '{}': device '{}' is not cpu or cuda", text, device));
    if (*seen) throw UsageError(fmt::format("backend '{}': device '{}' is named twice", text, device));
    *seen = true;
    (device == "cpu" ? spec.cpu : spec.cuda) = deviceBackend(text, device, name);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return spec;
}

BackendSpec resolveBackendSpec(BackendSpec spec, bool nccl_viable) {
  auto settle = [&](DeviceBackend b) {
    return b == DeviceBackend::kNcclIfViable ? (nccl_viable ? DeviceBackend::kNccl : DeviceBackend::kHost) : b;
  };
  return BackendSpec{settle(spec.cpu), settle(spec.cuda)};
}

std::string describeBackendSpec(const BackendSpec& spec) {
  auto name = [](DeviceBackend b) -> std::string_view {
    switch (b) {
      case DeviceBackend::kHost: return "gloo";
      case DeviceBackend::kNccl: return "nccl";
      case DeviceBackend::kNcclIfViable: return "auto";
      case DeviceBackend::kNone: break;
    }
    return "";
  };
  if (spec.cpu == DeviceBackend::kHost && spec.cuda == DeviceBackend::kHost) return "gloo";
  if (spec.cpu == DeviceBackend::kNone && spec.cuda == DeviceBackend::kNccl) return "nccl";
  std::string out;
  if (spec.cpu != DeviceBackend::kNone) out += fmt::format("cpu:{}", name(spec.cpu));
  if (spec.cuda != DeviceBackend::kNone) out += fmt::format("{}cuda:{}", out.empty() ? "" : ",", name(spec.cuda));
  return out;
}

}  // namespace ddprun::runtime
