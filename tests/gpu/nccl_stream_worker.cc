// torch's stream semantics of ddprun::dist on NCCL, checked under ddprun on the GPU machine
// (ctest label gpu): ops run on the communication stream after what the caller's current stream
// queued before them, wait() orders the caller's stream without blocking the host, barrier()
// blocks the host, and the caching allocator does not hand out a tensor's memory while an op
// still uses it. A GPU sleep (at::cuda::sleep) holds the caller's stream so that each check
// sees the state while the op is pending; none of them measures time.
//
//   ddprun --standalone --nproc_per_node=N --no_python tests/gpu/per_rank_hostid.sh
//       build/bin/nccl_stream_worker [--sleep-cycles C]
//
// Prints "ok: <check>" per check and "rank R of N: stream checks ok"; exits 1 with
// "FAILED: <check>: <detail>" at the first one that fails.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "worker_runtime/distributed.h"
#include "worker_runtime/env_contract.h"
#include "worker_runtime/error_record.h"

namespace dist = ddprun::dist;

namespace {

class Failed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

int64_t g_sleep_cycles = 2'000'000'000;  // about a second on an H100: far longer than any host step here
at::Device g_device(at::kCUDA, 0);
int g_rank = 0, g_world = 1;

void check(bool ok, const std::string& name, const std::string& detail) {
  if (!ok) throw Failed(fmt::format("FAILED: {}: {}", name, detail));
}

void passed(const std::string& name) {
  std::printf("ok: %s\n", name.c_str());
  std::fflush(stdout);
}

at::Tensor filled(double value, int64_t n = 1 << 20) {
  return at::full({n}, value, at::TensorOptions().dtype(at::kFloat).device(g_device));
}

// sum over ranks of (rank + 1)
double rankSum() { return g_world * (g_world + 1) / 2.0; }

double valueOf(const at::Tensor& t) {
  at::Tensor host = t.cpu();  // waits for the current stream only
  const double first = host[0].item<double>();
  check(host.eq(first).all().item<bool>(), "uniform result", "the elements of the result differ");
  return first;
}

void orderedAfterCallersStream() {
  const std::string name = "an async all_reduce waits for what the caller's stream queued before it";
  at::Tensor x = filled(-100);
  at::cuda::sleep(g_sleep_cycles);
  x.fill_(g_rank + 1);  // queued behind the sleep: an op that did not wait would read -100
  auto work = dist::all_reduce(x, dist::ReduceOp::SUM, {}, /*async_op=*/true);
  work->wait();
  check(!work->isCompleted(), "wait() does not block the host",
        "the Work was complete when wait() returned, with the caller's stream still asleep");
  passed("wait() does not block the host");
  x.mul_(2);  // queued on the caller's stream: must run after the all_reduce
  const double got = valueOf(x);
  check(got == 2 * rankSum(), name, fmt::format("got {}, expected {}", got, 2 * rankSum()));
  passed(name);
  passed("wait() orders the caller's stream after the op");
}

void blockingReturnsBeforeTheGpu() {
  const std::string name = "a blocking all_reduce returns once the caller's stream is ordered, as torch's does";
  at::Tensor x = filled(0);
  at::cuda::sleep(g_sleep_cycles);
  x.fill_(g_rank + 1);
  auto work = dist::all_reduce(x);
  check(!work->isCompleted(), name, "the host waited for the GPU");
  const double got = valueOf(x);
  check(got == rankSum(), name, fmt::format("got {}, expected {}", got, rankSum()));
  passed(name);
}

void allocatorKnowsTheCommStream() {
  const std::string name = "memory an op still uses is not handed out again (recordStream)";
  at::Tensor x = filled(0);
  at::cuda::sleep(g_sleep_cycles);
  x.fill_(g_rank + 1);
  const void* used = x.data_ptr();
  auto work = dist::all_reduce(x, dist::ReduceOp::SUM, {}, /*async_op=*/true);
  x.reset();  // the caller lets go while the op is pending
  check(!work->isCompleted(), name, "the op finished before the check could run");
  at::Tensor y = at::empty({1 << 20}, at::TensorOptions().dtype(at::kFloat).device(g_device));
  check(y.data_ptr() != used, name, "a new tensor got the memory of the pending op's tensor");
  work->wait();
  at::cuda::getCurrentCUDAStream(g_device.index()).synchronize();
  passed(name);
}

void sideStream() {
  const std::string name = "ops follow the caller's current stream when it is not the default one";
  auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, g_device.index());
  c10::cuda::CUDAStreamGuard on_side(side);
  at::Tensor x = filled(-100);
  at::cuda::sleep(g_sleep_cycles);
  x.fill_(g_rank + 1);
  dist::all_reduce(x);
  x.add_(1);
  const double got = valueOf(x);
  check(got == rankSum() + 1, name, fmt::format("got {}, expected {}", got, rankSum() + 1));
  passed(name);
}

void barrierBlocksTheHost() {
  const std::string name = "barrier() blocks the host until the group's queued work is done, as torch's does";
  auto stream = at::cuda::getCurrentCUDAStream(g_device.index());
  at::cuda::sleep(g_sleep_cycles);
  at::cuda::CUDAEvent after_sleep;
  after_sleep.record(stream);
  dist::barrier();
  check(after_sleep.query(), name, "barrier() returned with the caller's stream still asleep");
  passed(name);
}

void refusesCpuTensors() {
  const std::string name = "a CPU tensor on a group whose backend is nccl is refused, naming the op";
  at::Tensor cpu = at::ones({4});
  try {
    dist::all_reduce(cpu);
  } catch (const std::exception& e) {
    check(std::string(e.what()).find("all_reduce: a CPU tensor") != std::string::npos, name, e.what());
    passed(name);
    return;
  }
  throw Failed("FAILED: " + name + ": no error");
}

int run(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--sleep-cycles") g_sleep_cycles = std::stoll(argv[i + 1]);
  }
  g_device = at::Device(
      at::kCUDA, static_cast<at::DeviceIndex>(ddprun::runtime::localDeviceIndex(static_cast<int>(at::getNumGPUs()))));
  c10::cuda::set_device(g_device.index());
  dist::init_process_group("nccl");
  g_rank = dist::get_rank();
  g_world = dist::get_world_size();
  check(dist::get_backend() == "nccl", "get_backend", dist::get_backend());
  dist::barrier();  // every communicator is up before the checks
  orderedAfterCallersStream();
  blockingReturnsBeforeTheGpu();
  allocatorKnowsTheCommStream();
  sideStream();
  barrierBlocksTheHost();
  refusesCpuTensors();
  dist::barrier();
  dist::destroy_process_group();
  std::printf("rank %d of %d: stream checks ok\n", g_rank, g_world);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::runtime::recordErrors([&] {
    try {
      return run(argc, argv);
    } catch (const Failed& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
  });
}
