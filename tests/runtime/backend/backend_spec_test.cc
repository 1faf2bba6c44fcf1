// The backend strings of init_process_group and new_group, read as torch reads them.
#include <catch2/catch.hpp>

#include "common/error.h"
#include "worker_runtime/backend/backend_spec.h"

using ddprun::UsageError;
using namespace ddprun::runtime;

namespace {

std::string errorOf(const std::string& text) {
  try {
    parseBackendSpec(text);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("backend strings: the single names", "[unit][backend]") {
  const auto gloo = parseBackendSpec("gloo");
  CHECK(gloo.cpu == DeviceBackend::kHost);
  CHECK(gloo.cuda == DeviceBackend::kHost);  // CUDA tensors through host copies, as gloo does
  CHECK(parseBackendSpec("cpu").cuda == DeviceBackend::kHost);
  const auto nccl = parseBackendSpec("nccl");
  CHECK(nccl.cpu == DeviceBackend::kNone);
  CHECK(nccl.cuda == DeviceBackend::kNccl);
  const auto automatic = parseBackendSpec("auto");
  CHECK(automatic.cpu == DeviceBackend::kHost);
  CHECK(automatic.cuda == DeviceBackend::kNcclIfViable);
  // Case does not matter, as in torch's Backend().
  CHECK(parseBackendSpec("NCCL").cuda == DeviceBackend::kNccl);
  CHECK(parseBackendSpec("Gloo").cpu == DeviceBackend::kHost);
}

TEST_CASE("backend strings: the per-device form", "[unit][backend]") {
  const auto both = parseBackendSpec("cpu:gloo,cuda:nccl");
  CHECK(both.cpu == DeviceBackend::kHost);
  CHECK(both.cuda == DeviceBackend::kNccl);
  const auto reversed = parseBackendSpec("cuda:nccl,cpu:gloo");
  CHECK(reversed.cpu == DeviceBackend::kHost);
  CHECK(reversed.cuda == DeviceBackend::kNccl);
  // A device left out has no backend.
  const auto cpu_only = parseBackendSpec("cpu:gloo");
  CHECK(cpu_only.cpu == DeviceBackend::kHost);
  CHECK(cpu_only.cuda == DeviceBackend::kNone);
  const auto staged = parseBackendSpec("cuda:gloo");
  CHECK(staged.cpu == DeviceBackend::kNone);
  CHECK(staged.cuda == DeviceBackend::kHost);
}

TEST_CASE("backend strings: bad ones are one line naming the culprit", "[unit][backend]") {
  CHECK_THAT(errorOf("mpi"), Catch::Contains("backend 'mpi' is not available"));
  CHECK_THAT(errorOf("cpu:nccl"), Catch::Contains("NCCL runs CUDA tensors only"));
  CHECK_THAT(errorOf("cpu:gloo,cpu:gloo"), Catch::Contains("device 'cpu' is named twice"));
  CHECK_THAT(errorOf("xpu:gloo"), Catch::Contains("device 'xpu' is not cpu or cuda"));
  CHECK_THAT(errorOf("cuda:ucc"), Catch::Contains("'ucc' is not a backend here"));
  CHECK_THAT(errorOf("cpu:gloo,"), Catch::Contains("entry '' is not device:backend"));
  CHECK_THAT(errorOf("cpu:"), Catch::Contains("entry 'cpu:' is not device:backend"));
  CHECK(errorOf("cpu:gloo,cuda:nccl").find('\n') == std::string::npos);
}

TEST_CASE("backend strings: auto settles on NCCL only where it is viable", "[unit][backend]") {
  const auto automatic = parseBackendSpec("auto");
  CHECK(resolveBackendSpec(automatic, true).cuda == DeviceBackend::kNccl);
  CHECK(resolveBackendSpec(automatic, false).cuda == DeviceBackend::kHost);
  // An explicit choice is left as it is (init_process_group refuses NCCL where not viable).
  CHECK(resolveBackendSpec(parseBackendSpec("nccl"), false).cuda == DeviceBackend::kNccl);
}

TEST_CASE("backend strings: named as torch's get_backend names them", "[unit][backend]") {
  CHECK(describeBackendSpec(resolveBackendSpec(parseBackendSpec("auto"), false)) == "gloo");
  CHECK(describeBackendSpec(resolveBackendSpec(parseBackendSpec("auto"), true)) == "cpu:gloo,cuda:nccl");
  CHECK(describeBackendSpec(parseBackendSpec("nccl")) == "nccl");
  CHECK(describeBackendSpec(parseBackendSpec("cpu")) == "gloo");
  CHECK(describeBackendSpec(parseBackendSpec("cpu:gloo")) == "cpu:gloo");
  CHECK(describeBackendSpec(parseBackendSpec("cuda:gloo")) == "cuda:gloo");
}
