#include "worker_runtime/distributed.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>

#include <fmt/format.h>

#include "common/env_names.h"
#include "common/env_reader.h"
#include "common/error.h"
#include "rendezvous/store_server.h"
#include "rendezvous/tcp_store_client.h"
#include "worker_runtime/backend/host_backend.h"
#include "worker_runtime/env_contract.h"

namespace ddprun::dist {

using runtime::CollectiveContext;
using runtime::DType;
using runtime::HostBackend;
using runtime::HostBackendOptions;

class ProcessGroup {
 public:
  ProcessGroup(std::vector<int> ranks, int group_rank, std::unique_ptr<HostBackend> backend)
      : ranks_(std::move(ranks)), group_rank_(group_rank), backend_(std::move(backend)) {}

  int rank() const { return group_rank_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  HostBackend& backend() { return *backend_; }
  // Group rank of a global rank; throws for ranks outside the group.
  int local(int global, const char* what) const {
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (ranks_[i] == global) return static_cast<int>(i);
    }
    throw DdprunError(fmt::format("{}: rank {} is not in this group", what, global));
  }
  int global(int local_rank) const { return ranks_.at(local_rank); }

 private:
  std::vector<int> ranks_;
  int group_rank_;
  std::unique_ptr<HostBackend> backend_;
};

namespace {

struct GlobalState {
  std::mutex mutex;
  std::unique_ptr<rendezvous::StoreServer> server;
  std::unique_ptr<rendezvous::TcpStoreClient> store;
  std::string prefix;
  std::string address;
  std::chrono::milliseconds timeout{};
  Group world;
  int next_group = 0;
};

GlobalState& state() {
  static GlobalState s;
  return s;
}

ProcessGroup& resolve(const Group& group) {
  if (group) return *group;
  auto& s = state();
  if (!s.world) throw DdprunError("the default process group is not initialized (call init_process_group first)");
  return *s.world;
}

DType dtypeOf(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kDouble: return DType::kFloat64;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kInt: return DType::kInt32;
    case at::kLong: return DType::kInt64;
    case at::kByte: return DType::kUInt8;
    default:
      throw DdprunError(
          fmt::format("dtype {} is not supported (float32, float64, float16, bfloat16, int32, "
                      "int64, uint8 are)",
                      c10::toString(t.scalar_type())));
  }
}

// What the flight recorder keeps of an operation on `t` (its data type and element count).
FlightOpInfo flightInfo(FlightOp op, const at::Tensor& t, int root = -1) {
  // runtime::DType and FlightDType share their codes.
  static_assert(static_cast<int>(DType::kUInt8) == static_cast<int>(FlightDType::kUInt8));
  return FlightOpInfo{op, static_cast<FlightDType>(dtypeOf(t)), static_cast<uint64_t>(t.numel()), root};
}

runtime::ReduceOp opOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return runtime::ReduceOp::kSum;
    case ReduceOp::PRODUCT: return runtime::ReduceOp::kProduct;
    case ReduceOp::MIN: return runtime::ReduceOp::kMin;
    case ReduceOp::MAX: return runtime::ReduceOp::kMax;
    case ReduceOp::AVG: return runtime::ReduceOp::kAvg;
  }
  return runtime::ReduceOp::kSum;
}

// A tensor as the backend sees it: contiguous CPU memory. A non-contiguous tensor is
// worked on through a contiguous copy that is written back when the operation ends.
struct Staged {
  at::Tensor user;
  at::Tensor buf;
  void finish() {
    if (!buf.is_same(user)) user.copy_(buf);
  }
  void* data() { return buf.data_ptr(); }
  size_t bytes() const { return buf.numel() * buf.element_size(); }
};

Staged stage(const at::Tensor& t, const char* what) {
  if (!t.device().is_cpu()) throw DdprunError(fmt::format("{}: only CPU tensors run on the host backend", what));
  dtypeOf(t);
  return Staged{t, t.is_contiguous() ? t : t.contiguous()};
}

// A list of equally sized tensors (same dtype, checkList) as one contiguous buffer, and
// back. Contiguous tensors, the usual case, go by memcpy: ATen's cat and copy_ cost a few
// microseconds of dispatch each, as much as a whole small collective on shared memory.
at::Tensor flatten(const std::vector<at::Tensor>& list) {
  const int64_t n = list.empty() ? 0 : list[0].numel();
  auto flat =
      at::empty({static_cast<int64_t>(list.size()) * n}, list.empty() ? at::TensorOptions() : list[0].options());
  if (n == 0) return flat;
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].is_contiguous()) {
      std::memcpy(static_cast<uint8_t*>(flat.data_ptr()) + i * n * flat.element_size(), list[i].data_ptr(),
                  n * flat.element_size());
    } else {
      flat.narrow(0, static_cast<int64_t>(i) * n, n).view(list[i].sizes()).copy_(list[i]);
    }
  }
  return flat;
}

void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& list) {
  for (size_t i = 0; i < list.size(); ++i) {
    const int64_t n = list[i].numel();
    if (n == 0) continue;
    const auto* from = static_cast<const uint8_t*>(flat.data_ptr()) + i * n * flat.element_size();
    if (list[i].is_contiguous()) {
      std::memcpy(list[i].data_ptr(), from, n * flat.element_size());
    } else {
      list[i].copy_(flat.narrow(0, static_cast<int64_t>(i) * n, n).view(list[i].sizes()));
    }
  }
}

bool allContiguous(const std::vector<at::Tensor>& list) {
  return std::all_of(list.begin(), list.end(), [](const at::Tensor& t) { return t.is_contiguous(); });
}

// The data pointers of a list of contiguous tensors (void or const void).
template <typename T>
std::vector<T*> pointersOf(const std::vector<at::Tensor>& list) {
  std::vector<T*> pointers;
  pointers.reserve(list.size());
  for (const auto& t : list) pointers.push_back(t.data_ptr());
  return pointers;
}

// Queues an async op; runs a synchronous one (inline when the group is idle) and waits.
WorkPtr issue(ProcessGroup& g, std::function<void(CollectiveContext&)> collective, const FlightOpInfo& info,
              bool async_op) {
  if (async_op) return g.backend().enqueue(std::move(collective), info);
  auto work = g.backend().run(std::move(collective), info);
  work->wait();
  return work;
}

void checkList(const std::vector<at::Tensor>& list, const at::Tensor& like, int size, const char* what) {
  if (static_cast<int>(list.size()) != size) {
    throw DdprunError(fmt::format("{}: the list has {} tensors; the group has {} ranks", what, list.size(), size));
  }
  for (const auto& t : list) {
    if (t.numel() != like.numel() || t.scalar_type() != like.scalar_type()) {
      throw DdprunError(fmt::format("{}: every tensor in the list must match the input ({} elements of {})", what,
                                    like.numel(), c10::toString(like.scalar_type())));
    }
  }
}

// Where other hosts can reach this one: its host name's address, else loopback.
std::string ownAddress() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  std::string address = "127.0.0.1";
  if (host[0] && ::getaddrinfo(host, nullptr, &hints, &found) == 0 && found) {
    char buf[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, buf, sizeof buf);
    address = buf;
    ::freeaddrinfo(found);
  }
  return address;
}

void connectStore(GlobalState& s, const std::string& host, int port, bool host_it, std::chrono::milliseconds timeout) {
  if (host_it) {
    rendezvous::StoreServerOptions options;
    options.host = "0.0.0.0";
    options.port = port;
    s.server = std::make_unique<rendezvous::StoreServer>(options);
    port = s.server->port();
  }
  rendezvous::StoreClientOptions options;
  options.host = host;
  options.port = port;
  options.timeout = timeout;
  options.connect_timeout = timeout;
  s.store = std::make_unique<rendezvous::TcpStoreClient>(options);
}

// The port of a tcp://host:port init method, a whole number in 1..65535. atoi made "abc"
// port 0 (rank 0 served an ephemeral port nobody knew) and wrapped 99999 to 34463 (the
// others dialled it for the whole group timeout).
int initMethodPort(const std::string& method, std::string_view text) {
  int port = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
  if (ec != std::errc() || end != text.data() + text.size() || port < 1 || port > 65535) {
    throw UsageError(fmt::format("init_process_group({}): port '{}' is not a whole number in 1..65535", method, text));
  }
  return port;
}

}  // namespace

void init_process_group(const InitOptions& o) {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  if (s.world) throw DdprunError("init_process_group: the default process group is already initialized");
  if (o.backend != "auto" && o.backend != "gloo" && o.backend != "cpu") {
    throw DdprunError("init_process_group: backend '" + o.backend + "' is not available (use auto, gloo or cpu)");
  }
  int rank = o.rank, size = o.world_size;
  const std::string& method = o.init_method;
  // Every setting is checked before connecting: a bad one must not wait out the timeout.
  const auto restart_count = env::integerOr(env::kRestartCount, 0, 0, INT_MAX);
  if (method.rfind("env://", 0) == 0) {
    const auto e = runtime::StoreEnv::fromEnvironment(rank, size);
    rank = e.rank;
    size = e.world_size;
    connectStore(s, e.master_addr, e.master_port, !e.use_agent_store && rank == 0, o.timeout);
  } else if (method.rfind("tcp://", 0) == 0) {
    if (rank < 0 || size < 1) throw DdprunError("init_process_group(tcp://): rank and world_size are required");
    if (rank >= size) throw DdprunError(fmt::format("init_process_group: rank {} of {}", rank, size));
    std::string hostport = method.substr(6);
    auto colon = hostport.rfind(':');
    if (colon == std::string::npos) throw DdprunError("init_process_group: expected tcp://host:port, got " + method);
    connectStore(s, hostport.substr(0, colon), initMethodPort(method, std::string_view(hostport).substr(colon + 1)),
                 rank == 0, o.timeout);
  } else if (method.rfind("file://", 0) == 0) {
    if (rank < 0 || size < 1) throw DdprunError("init_process_group(file://): rank and world_size are required");
    if (rank >= size) throw DdprunError(fmt::format("init_process_group: rank {} of {}", rank, size));
    const std::string path = method.substr(7);
    // Rank 0 serves the store and leaves its address in the file; the others wait for it.
    if (rank == 0) {
      connectStore(s, "127.0.0.1", 0, true, o.timeout);
      const std::string tmp = path + ".tmp." + std::to_string(::getpid());
      std::ofstream(tmp) << ownAddress() << " " << s.server->port() << "\n";
      std::filesystem::rename(tmp, path);
    } else {
      const auto deadline = std::chrono::steady_clock::now() + o.timeout;
      std::string host;
      int port = 0;
      while (!(std::ifstream(path) >> host >> port)) {
        if (std::chrono::steady_clock::now() > deadline) {
          throw DdprunError("init_process_group(" + method + "): rank 0 never wrote the file");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      connectStore(s, host, port, false, o.timeout);
    }
  } else {
    throw DdprunError("init_process_group: unknown init_method '" + method + "' (env://, tcp://, file://)");
  }
  s.prefix = fmt::format("ddprun/pg/{}/", restart_count);
  s.address = s.store->localAddress();
  s.timeout = o.timeout;
  s.next_group = 0;
  std::vector<int> all(size);
  for (int i = 0; i < size; ++i) all[i] = i;
  HostBackendOptions backend_options;
  backend_options.flight_rank = rank;
  auto backend =
      std::make_unique<HostBackend>(*s.store, s.prefix + "world/", rank, size, s.address, o.timeout, backend_options);
  s.world = std::make_shared<ProcessGroup>(all, rank, std::move(backend));
}

void init_process_group(const std::string& backend, const std::string& init_method, int world_size, int rank,
                        std::chrono::milliseconds timeout) {
  init_process_group(InitOptions{backend, init_method, world_size, rank, timeout});
}

bool is_initialized() {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  return s.world != nullptr;
}

void destroy_process_group() {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  s.world.reset();
  s.store.reset();
  s.server.reset();
}

int get_rank(const Group& group) { return resolve(group).rank(); }
int get_world_size(const Group& group) { return resolve(group).size(); }
int get_global_rank(const Group& group, int group_rank) {
  ProcessGroup& g = resolve(group);
  if (group_rank < 0 || group_rank >= g.size()) {
    throw DdprunError(fmt::format("get_global_rank: group rank {} is outside a group of {}", group_rank, g.size()));
  }
  return g.global(group_rank);
}

Group new_group(const std::vector<int>& ranks, std::chrono::milliseconds timeout) {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  if (!s.world) throw DdprunError("new_group: call init_process_group first");
  const int id = ++s.next_group;
  const int me = s.world->rank();
  int group_rank = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= s.world->size()) {
      throw DdprunError(fmt::format("new_group: rank {} is outside the world of {}", ranks[i], s.world->size()));
    }
    if (ranks[i] == me) group_rank = static_cast<int>(i);
  }
  if (group_rank < 0) return nullptr;
  HostBackendOptions backend_options;
  backend_options.flight_group = id;
  backend_options.flight_rank = me;
  auto backend = std::make_unique<HostBackend>(*s.store, fmt::format("{}group/{}/", s.prefix, id), group_rank,
                                               static_cast<int>(ranks.size()), s.address,
                                               timeout.count() > 0 ? timeout : s.timeout, backend_options);
  return std::make_shared<ProcessGroup>(ranks, group_rank, std::move(backend));
}

WorkPtr isend(const at::Tensor& tensor, int dst, const Group& group, int tag) {
  ProcessGroup& g = resolve(group);
  auto staged = std::make_shared<Staged>(stage(tensor, "isend"));
  // The callback owns the staged copy until the message is out.
  return g.backend().p2p().send(
      g.local(dst, "isend"), tag, staged->data(), staged->bytes(), runtime::Clock::now() + g.backend().timeout(),
      [staged] {}, static_cast<FlightDType>(dtypeOf(staged->buf)));
}

WorkPtr irecv(at::Tensor& tensor, int src, const Group& group, int tag) {
  ProcessGroup& g = resolve(group);
  auto staged = std::make_shared<Staged>(stage(tensor, "irecv"));
  return g.backend().p2p().recv(
      g.local(src, "irecv"), tag, staged->data(), staged->bytes(), runtime::Clock::now() + g.backend().timeout(),
      [staged] { staged->finish(); }, static_cast<FlightDType>(dtypeOf(staged->buf)));
}

void send(const at::Tensor& tensor, int dst, const Group& group, int tag) { isend(tensor, dst, group, tag)->wait(); }

int recv(at::Tensor& tensor, int src, const Group& group, int tag) {
  irecv(tensor, src, group, tag)->wait();
  return src;
}

WorkPtr broadcast(at::Tensor& tensor, int src, const Group& group, bool async_op) {
  ProcessGroup& g = resolve(group);
  const int root = g.local(src, "broadcast");
  auto staged = stage(tensor, "broadcast");
  return issue(
      g,
      [staged, root](CollectiveContext& ctx) mutable {
        runtime::broadcast(ctx, staged.data(), staged.bytes(), root);
        staged.finish();
      },
      flightInfo(FlightOp::kBroadcast, staged.buf, root), async_op);
}

WorkPtr all_reduce(at::Tensor& tensor, ReduceOp op, const Group& group, bool async_op) {
  ProcessGroup& g = resolve(group);
  auto staged = stage(tensor, "all_reduce");
  const DType dtype = dtypeOf(tensor);
  return issue(
      g,
      [staged, dtype, op](CollectiveContext& ctx) mutable {
        runtime::allReduce(ctx, staged.data(), staged.buf.numel(), dtype, opOf(op));
        staged.finish();
      },
      flightInfo(FlightOp::kAllReduce, staged.buf), async_op);
}

WorkPtr reduce(at::Tensor& tensor, int dst, ReduceOp op, const Group& group, bool async_op) {
  ProcessGroup& g = resolve(group);
  const int root = g.local(dst, "reduce");
  auto staged = stage(tensor, "reduce");
  const DType dtype = dtypeOf(tensor);
  return issue(
      g,
      [staged, dtype, op, root](CollectiveContext& ctx) mutable {
        runtime::reduce(ctx, staged.data(), staged.buf.numel(), dtype, opOf(op), root);
        staged.finish();
      },
      flightInfo(FlightOp::kReduce, staged.buf, root), async_op);
}

WorkPtr all_gather(std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor, const Group& group, bool async_op) {
  ProcessGroup& g = resolve(group);
  checkList(tensor_list, tensor, g.size(), "all_gather");
  auto in = stage(tensor, "all_gather");
  const FlightOpInfo info = flightInfo(FlightOp::kAllGather, in.buf);
  auto outputs = tensor_list;
  if (allContiguous(outputs)) {
    // Straight into the caller's tensors: no flat buffer to allocate and copy out of.
    return issue(
        g,
        [in, outputs](CollectiveContext& ctx) {
          runtime::allGatherInto(ctx, in.buf.data_ptr(), pointersOf<void>(outputs).data(), in.bytes());
        },
        info, async_op);
  }
  auto flat = at::empty({static_cast<int64_t>(g.size()) * tensor.numel()}, tensor.options());
  return issue(
      g,
      [in, flat, outputs](CollectiveContext& ctx) mutable {
        runtime::allGather(ctx, in.data(), flat.data_ptr(), in.bytes());
        unflatten(flat, outputs);
      },
      info, async_op);
}

WorkPtr gather(const at::Tensor& tensor, std::vector<at::Tensor>* gather_list, int dst, const Group& group,
               bool async_op) {
  ProcessGroup& g = resolve(group);
  const int root = g.local(dst, "gather");
  const bool is_root = g.rank() == root;
  if (is_root && !gather_list) throw DdprunError("gather: the destination rank needs a gather_list");
  if (is_root) checkList(*gather_list, tensor, g.size(), "gather");
  auto in = stage(tensor, "gather");
  auto flat = is_root ? at::empty({static_cast<int64_t>(g.size()) * tensor.numel()}, tensor.options()) : at::Tensor();
  std::vector<at::Tensor> outputs = is_root ? *gather_list : std::vector<at::Tensor>{};
  return issue(
      g,
      [in, flat, outputs, root](CollectiveContext& ctx) mutable {
        runtime::gather(ctx, in.data(), flat.defined() ? flat.data_ptr() : nullptr, in.bytes(), root);
        unflatten(flat, outputs);
      },
      flightInfo(FlightOp::kGather, in.buf, root), async_op);
}

WorkPtr scatter(at::Tensor& tensor, const std::vector<at::Tensor>* scatter_list, int src, const Group& group,
                bool async_op) {
  ProcessGroup& g = resolve(group);
  const int root = g.local(src, "scatter");
  const bool is_root = g.rank() == root;
  if (is_root && !scatter_list) throw DdprunError("scatter: the source rank needs a scatter_list");
  at::Tensor flat;
  if (is_root) {
    checkList(*scatter_list, tensor, g.size(), "scatter");
    flat = flatten(*scatter_list);
  }
  auto out = stage(tensor, "scatter");
  return issue(
      g,
      [out, flat, root](CollectiveContext& ctx) mutable {
        runtime::scatter(ctx, flat.defined() ? flat.data_ptr() : nullptr, out.data(), out.bytes(), root);
        out.finish();
      },
      flightInfo(FlightOp::kScatter, out.buf, root), async_op);
}

WorkPtr reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& input_list, ReduceOp op, const Group& group,
                       bool async_op) {
  ProcessGroup& g = resolve(group);
  checkList(input_list, output, g.size(), "reduce_scatter");
  auto out = stage(output, "reduce_scatter");
  const DType dtype = dtypeOf(output);
  const FlightOpInfo info = flightInfo(FlightOp::kReduceScatter, out.buf);
  // The output may be one of the inputs: every path copies (or sends) a chunk of the other
  // ranks' blocks before it writes that chunk of the result.
  if (allContiguous(input_list)) {
    // Straight from the caller's tensors: no flat copy of the input to allocate and fill.
    return issue(
        g,
        [out, inputs = input_list, dtype, op](CollectiveContext& ctx) mutable {
          runtime::reduceScatterFrom(ctx, pointersOf<const void>(inputs).data(), out.data(), out.buf.numel(), dtype,
                                     opOf(op));
          out.finish();
        },
        info, async_op);
  }
  auto flat = flatten(input_list);
  return issue(
      g,
      [out, flat, dtype, op](CollectiveContext& ctx) mutable {
        runtime::reduceScatter(ctx, flat.data_ptr(), out.data(), out.buf.numel(), dtype, opOf(op));
        out.finish();
      },
      info, async_op);
}

WorkPtr all_to_all(std::vector<at::Tensor>& output_tensor_list, const std::vector<at::Tensor>& input_tensor_list,
                   const Group& group, bool async_op) {
  ProcessGroup& g = resolve(group);
  const size_t p = g.size();
  if (output_tensor_list.size() != p || input_tensor_list.size() != p) {
    throw DdprunError(fmt::format("all_to_all: both lists need {} tensors (the group size)", p));
  }
  std::vector<Staged> ins, outs;
  for (size_t i = 0; i < p; ++i) {
    ins.push_back(stage(input_tensor_list[i], "all_to_all"));
    outs.push_back(stage(output_tensor_list[i], "all_to_all"));
  }
  uint64_t sent = 0;
  for (const auto& t : input_tensor_list) sent += static_cast<uint64_t>(t.numel());
  const FlightOpInfo all_to_all_info{FlightOp::kAllToAll, static_cast<FlightDType>(dtypeOf(input_tensor_list[0])), sent,
                                     -1};
  // Uneven sizes are allowed, as in torch: every pair exchanges its own block, all at once.
  return issue(
      g,
      [ins, outs](CollectiveContext& ctx) mutable {
        std::vector<std::span<const uint8_t>> in_blocks;
        std::vector<std::span<uint8_t>> out_blocks;
        for (auto& i : ins) in_blocks.emplace_back(static_cast<const uint8_t*>(i.data()), i.bytes());
        for (auto& o : outs) out_blocks.emplace_back(static_cast<uint8_t*>(o.data()), o.bytes());
        runtime::allToAllV(ctx, in_blocks, out_blocks);
        for (auto& o : outs) o.finish();
      },
      all_to_all_info, async_op);
}

WorkPtr barrier(const Group& group, bool async_op) {
  ProcessGroup& g = resolve(group);
  return issue(
      g, [](CollectiveContext& ctx) { runtime::barrier(ctx); },
      FlightOpInfo{FlightOp::kBarrier, FlightDType::kNone, 0, -1}, async_op);
}

}  // namespace ddprun::dist
