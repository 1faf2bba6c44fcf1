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

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>

#include "common/env_names.h"
#include "common/env_reader.h"
#include "common/error.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/store/tcp_store_client.h"
#include "worker_runtime/backend/backend_spec.h"
#include "worker_runtime/backend/host_tensor_backend.h"
#include "worker_runtime/backend/nccl_tensor_backend.h"
#include "worker_runtime/env_contract.h"
#include "worker_runtime/process_group_impl.h"
#include "worker_runtime/recovery/in_job.h"

namespace ddprun::dist {

using runtime::BackendSpec;
using runtime::DeviceBackend;
using runtime::HostBackend;
using runtime::HostBackendOptions;

GlobalState& state() {
  static GlobalState s;
  return s;
}

namespace {

ProcessGroup& resolve(const Group& group) {
  if (group) return *group;
  auto& s = state();
  if (!s.world) throw DdprunError("the default process group is not initialized (call init_process_group first)");
  return *s.world;
}

// The tensors of one call: equally many as the group has ranks, each like `like` (elements,
// dtype and device), as torch requires.
void checkList(const std::vector<at::Tensor>& list, const at::Tensor& like, int size, const char* what) {
  if (static_cast<int>(list.size()) != size) {
    throw DdprunError(fmt::format("{}: the list has {} tensors; the group has {} ranks", what, list.size(), size));
  }
  for (const auto& t : list) {
    if (t.numel() != like.numel() || t.scalar_type() != like.scalar_type()) {
      throw DdprunError(fmt::format("{}: every tensor in the list must match the input ({} elements of {})", what,
                                    like.numel(), c10::toString(like.scalar_type())));
    }
    if (t.device() != like.device()) {
      throw DdprunError(fmt::format("{}: a tensor in the list is on {}, the input on {}", what, t.device().str(),
                                    like.device().str()));
    }
  }
}

// A backend string read, its error (one line) prefixed with the call it was given to.
BackendSpec parseSpec(const std::string& text, const char* what) {
  try {
    return runtime::parseBackendSpec(text);
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("{}: {}", what, e.what()));
  }
}

// A spec with kNcclIfViable settled, or the error of asking for NCCL where it cannot run.
BackendSpec settle(const BackendSpec& spec, const std::string& text, const char* what) {
  std::string why;
  const bool wants_nccl = spec.cuda == DeviceBackend::kNccl || spec.cuda == DeviceBackend::kNcclIfViable;
  const bool viable = wants_nccl && ncclViable(&why);
  if (spec.cuda == DeviceBackend::kNccl && !viable) {
    throw UsageError(fmt::format("{}: backend '{}' asks for NCCL, which is not viable here: {}", what, text, why));
  }
  return runtime::resolveBackendSpec(spec, viable);
}

// The backends of a group as its settled spec names them. Every rank of the group calls it
// together (connecting is collective).
std::unique_ptr<HostTensorBackend> makeHost(const BackendSpec& spec, GlobalState& s, const std::string& prefix,
                                            int rank, int size, std::chrono::milliseconds timeout,
                                            const HostBackendOptions& options) {
  if (spec.cpu != DeviceBackend::kHost && spec.cuda != DeviceBackend::kHost) return nullptr;
  return std::make_unique<HostTensorBackend>(
      std::make_unique<HostBackend>(*s.store, prefix, rank, size, s.address, timeout, options));
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

// Where rank 0 serves the store of a tcp://host:port init: on the loopback address itself when
// the method names one (every rank dials it there, so nothing beyond this host needs it, and
// a test's store is not open to the network), else on every interface, as torch's TCPStore.
std::string storeBindHost(const std::string& host) {
  in_addr addr{};
  if (::inet_pton(AF_INET, host.c_str(), &addr) == 1 && (ntohl(addr.s_addr) >> 24) == 127) return host;
  return "0.0.0.0";
}

void connectStore(GlobalState& s, const std::string& host, int port, bool host_it, std::chrono::milliseconds timeout) {
  if (host_it) {
    rendezvous::StoreServerOptions options;
    options.host = storeBindHost(host);
    options.port = port;
    s.server = std::make_unique<rendezvous::StoreServer>(options);
    port = s.server->port();
  }
  rendezvous::StoreClientOptions options;
  options.host = host;
  options.port = port;
  options.timeout = timeout;
  options.connect_timeout = timeout;
  s.store = std::make_shared<rendezvous::TcpStoreClient>(options);
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
  const BackendSpec spec = settle(parseSpec(o.backend, "init_process_group"), o.backend, "init_process_group");
  int rank = o.rank, size = o.world_size;
  const std::string& method = o.init_method;
  bool use_agent_store = false;  // only an agent's store outlives every worker
  // Every setting is checked before connecting: a bad one must not wait out the timeout.
  const auto restart_count = env::integerOr(env::kRestartCount, 0, 0, INT_MAX);
  // The host backend reads DDPRUN_SHM when the group forms; a malformed one fails here, before
  // rank 0 serves the store on MASTER_PORT.
  static_cast<void>(env::booleanOr(env::kShm, true));
  if (method.rfind("env://", 0) == 0) {
    const auto e = runtime::StoreEnv::fromEnvironment(rank, size);
    use_agent_store = e.use_agent_store;
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
  s.restart_count = restart_count;
  // In-job recovery (recovery/in_job.h) forms the group itself: a replacement joins the
  // survivors' generation, and every generation's connections have keys of their own.
  if (recovery::startWorld(s, spec, rank, size, use_agent_store)) return;
  s.world = makeWorld(s, spec, s.prefix + "world/", rank, size, o.timeout);
}

Group makeWorld(GlobalState& s, const BackendSpec& spec, const std::string& prefix, int rank, int size,
                std::chrono::milliseconds timeout) {
  std::vector<int> all(size);
  for (int i = 0; i < size; ++i) all[i] = i;
  HostBackendOptions backend_options;
  backend_options.flight_rank = rank;
  auto host = makeHost(spec, s, prefix, rank, size, timeout, backend_options);
  std::unique_ptr<Backend> nccl;
  if (spec.cuda == DeviceBackend::kNccl) nccl = makeNcclBackend(NcclGroup{s.store, prefix, rank, size, timeout});
  return std::make_shared<ProcessGroup>(all, rank, spec, std::move(host), std::move(nccl));
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
  recovery::stop();
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

Group new_group(const std::vector<int>& ranks, std::chrono::milliseconds timeout, const std::string& backend) {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  if (!s.world) throw DdprunError("new_group: call init_process_group first");
  BackendSpec spec = s.world->spec();
  if (!backend.empty()) spec = settle(parseSpec(backend, "new_group"), backend, "new_group");
  const int id = ++s.next_group;
  const int me = s.world->rank();
  int group_rank = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= s.world->size()) {
      throw DdprunError(fmt::format("new_group: rank {} is outside the world of {}", ranks[i], s.world->size()));
    }
    if (ranks[i] == me) group_rank = static_cast<int>(i);
  }
  const auto group_timeout = timeout.count() > 0 ? timeout : s.timeout;
  const std::string prefix = fmt::format("{}group/{}/", s.prefix, id);
  const int size = static_cast<int>(ranks.size());
  // NCCL first: a split from the default group's communicator takes every rank of it.
  std::unique_ptr<Backend> nccl;
  if (spec.cuda == DeviceBackend::kNccl) {
    nccl =
        splitNcclBackend(s.world->nccl(), NcclGroup{s.store, prefix, group_rank, size, group_timeout}, group_rank >= 0);
  }
  if (group_rank < 0) return nullptr;
  HostBackendOptions backend_options;
  backend_options.flight_group = id;
  backend_options.flight_rank = me;
  auto host = makeHost(spec, s, prefix, group_rank, size, group_timeout, backend_options);
  return std::make_shared<ProcessGroup>(ranks, group_rank, spec, std::move(host), std::move(nccl));
}

std::string get_backend(const Group& group) { return runtime::describeBackendSpec(resolve(group).spec()); }

at::Device get_default_device(const Group& group) {
  if (resolve(group).spec().cpu != DeviceBackend::kNone) return at::kCPU;
  return c10::impl::getDeviceGuardImpl(at::kCUDA)->getDevice();
}

WorkPtr isend(const at::Tensor& tensor, int dst, const Group& group, int tag) {
  ProcessGroup& g = resolve(group);
  return g.forTensor(tensor, "isend").send(tensor, g.local(dst, "isend"), tag);
}

WorkPtr irecv(at::Tensor& tensor, int src, const Group& group, int tag) {
  ProcessGroup& g = resolve(group);
  return g.forTensor(tensor, "irecv").recv(tensor, g.local(src, "irecv"), tag);
}

std::vector<WorkPtr> batch_isend_irecv(const std::vector<P2POp>& ops) {
  if (ops.empty()) throw DdprunError("batch_isend_irecv: the list of operations is empty");
  ProcessGroup& g = resolve(ops[0].group);
  std::vector<P2PItem> items;
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    if (op.group != ops[0].group) {
      throw DdprunError(fmt::format("batch_isend_irecv: operation {} names another group than the first", i));
    }
    if (op.tensor.device().type() != ops[0].tensor.device().type()) {
      throw DdprunError(fmt::format("batch_isend_irecv: operation {} is on {}, the first on {}", i,
                                    op.tensor.device().str(), ops[0].tensor.device().str()));
    }
    const int peer = g.local(op.peer, "batch_isend_irecv");
    if (peer == g.rank()) {
      throw DdprunError(fmt::format("batch_isend_irecv: operation {} has this rank ({}) as its peer", i, op.peer));
    }
    items.push_back(P2PItem{op.op == P2POp::Kind::kSend, op.tensor, peer, op.tag});
  }
  return g.forTensor(ops[0].tensor, "batch_isend_irecv").batchP2P(items);
}

void send(const at::Tensor& tensor, int dst, const Group& group, int tag) { isend(tensor, dst, group, tag)->wait(); }

int recv(at::Tensor& tensor, int src, const Group& group, int tag) {
  irecv(tensor, src, group, tag)->wait();
  return src;
}

WorkPtr broadcast(at::Tensor& tensor, int src, const Group& group, bool async_op) {
  ProcessGroup& g = resolve(group);
  const int root = g.local(src, "broadcast");
  return g.forTensor(tensor, "broadcast").broadcast(tensor, root, async_op);
}

WorkPtr all_reduce(at::Tensor& tensor, ReduceOp op, const Group& group, bool async_op) {
  ProcessGroup& g = resolve(group);
  return g.forTensor(tensor, "all_reduce").allReduce(tensor, op, async_op);
}

WorkPtr reduce(at::Tensor& tensor, int dst, ReduceOp op, const Group& group, bool async_op) {
  ProcessGroup& g = resolve(group);
  const int root = g.local(dst, "reduce");
  return g.forTensor(tensor, "reduce").reduce(tensor, root, op, async_op);
}

WorkPtr all_gather(std::vector<at::Tensor>& tensor_list, const at::Tensor& tensor, const Group& group, bool async_op) {
  ProcessGroup& g = resolve(group);
  checkList(tensor_list, tensor, g.size(), "all_gather");
  return g.forTensor(tensor, "all_gather").allGather(tensor_list, tensor, async_op);
}

WorkPtr gather(const at::Tensor& tensor, std::vector<at::Tensor>* gather_list, int dst, const Group& group,
               bool async_op) {
  ProcessGroup& g = resolve(group);
  const int root = g.local(dst, "gather");
  const bool is_root = g.rank() == root;
  if (is_root && !gather_list) throw DdprunError("gather: the destination rank needs a gather_list");
  if (is_root) checkList(*gather_list, tensor, g.size(), "gather");
  return g.forTensor(tensor, "gather").gather(tensor, is_root ? gather_list : nullptr, root, async_op);
}

WorkPtr scatter(at::Tensor& tensor, const std::vector<at::Tensor>* scatter_list, int src, const Group& group,
                bool async_op) {
  ProcessGroup& g = resolve(group);
  const int root = g.local(src, "scatter");
  const bool is_root = g.rank() == root;
  if (is_root && !scatter_list) throw DdprunError("scatter: the source rank needs a scatter_list");
  if (is_root) checkList(*scatter_list, tensor, g.size(), "scatter");
  return g.forTensor(tensor, "scatter").scatter(tensor, is_root ? scatter_list : nullptr, root, async_op);
}

WorkPtr reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& input_list, ReduceOp op, const Group& group,
                       bool async_op) {
  ProcessGroup& g = resolve(group);
  checkList(input_list, output, g.size(), "reduce_scatter");
  return g.forTensor(output, "reduce_scatter").reduceScatter(output, input_list, op, async_op);
}

WorkPtr all_to_all(std::vector<at::Tensor>& output_tensor_list, const std::vector<at::Tensor>& input_tensor_list,
                   const Group& group, bool async_op) {
  ProcessGroup& g = resolve(group);
  const size_t p = g.size();
  if (output_tensor_list.size() != p || input_tensor_list.size() != p) {
    throw DdprunError(fmt::format("all_to_all: both lists need {} tensors (the group size)", p));
  }
  // Sizes may differ pair by pair, as in torch; dtype and device may not.
  const at::Tensor& like = input_tensor_list[0];
  const std::vector<at::Tensor>* lists[] = {&input_tensor_list, &output_tensor_list};
  for (const auto* list : lists) {
    for (const auto& t : *list) {
      if (t.scalar_type() != like.scalar_type() || t.device() != like.device()) {
        throw DdprunError(fmt::format("all_to_all: every tensor must be {} on {}, as the first input is",
                                      c10::toString(like.scalar_type()), like.device().str()));
      }
    }
  }
  return g.forTensor(like, "all_to_all").allToAll(output_tensor_list, input_tensor_list, async_op);
}

WorkPtr barrier(const Group& group, bool async_op) { return resolve(group).forBarrier().barrier(async_op); }

}  // namespace ddprun::dist
