// store_bench: ddprun's store server against torch's own TCPStore server, side by side in
// one run, both driven by the SAME client code (the c10d::TCPStore of the LibTorch it is built
// against, isServer=false: 1.13 in build/, 2.6 in build-torch2/; bench/store_compare runs both).
// Both servers run in this process, each on its own single I/O thread (ddprun's StoreServer;
// torch's TCPStore master daemon, started by a c10d::TCPStore with isServer=true); a fresh
// pair of servers is started for every round and every case, and the order alternates.
//
//   throughput: CLIENTS connections (one thread and one c10d::TCPStore each) loop over
//       set(key_i, 64-byte value) then get(key_i) for SECONDS; every get is checked against
//       what was set. ops/s counts each set and each get as one op (torch's get is a WAIT
//       round trip then a GET round trip; its set expects no reply). Each round runs both
//       servers back to back; the table shows medians over ROUNDS, and the ratio is the median
//       of the per-round ratios (robust to load that drifts on a shared machine).
//       Last line: `store ratio=<ours/torch>` (ops/s; goal: at least 1.5); the line before it,
//       `store srv_cpu_ratio=<torch/ours>`, compares the servers' CPU time per op, which is
//       what bounds ops/s when the clients have cores of their own.
//   wait fan-out: WAITERS connections (one thread and one c10d::TCPStore each, connecting
//       concurrently) each wait() on one key and then get() it. The key is set once every
//       client is connected and about to wait. connect(s): until all clients are up;
//       release(s): from the set until the last get has returned. Every client must be
//       served with the right value within the timeout. Median of WAIT_ROUNDS rounds.
//       Last line: `store_wait clients=N seconds=<ours release> torch_seconds=<torch release>`.
//
// Usage: store_bench [--seconds S] [--rounds R] [--clients N] [--waiters W] [--wait-rounds R]
//                    [--no-torch-wait]
// Exit status: 0 when every get returned what was set and every waiter was served, else 1.
#include <malloc.h>
#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "rendezvous/store/store_server.h"

namespace {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<uint8_t>;

constexpr size_t kValueBytes = 64;
const char* kHost = "127.0.0.1";

struct Config {
  double seconds = 1.0;
  int rounds = 5;
  int clients = 8;
  int waiters = 1024;
  int wait_rounds = 3;
  bool torch_wait = true;
};

// CPU seconds used so far by the calling thread, or by the whole process.
double cpuSeconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Heap bytes in use by this process (all malloc arenas and mmapped chunks), in MiB: unlike
// RSS, not blurred by freed memory that the allocator keeps for reuse.
double heapInUseMiB() {
  struct mallinfo2 m = mallinfo2();
  return static_cast<double>(m.uordblks + m.hblkhd) / (1024.0 * 1024.0);
}

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Options for every torch store here. LibTorch 2.x defaults to its libuv backend, and Debian 13's
// LibTorch 2.6 is built without libuv, where asking for it throws; the classic backend is the one
// that build has (and the only one LibTorch 1.13 has). --torch-libuv asks for libuv (pip torch
// 2.x has it, and makes it its default).
bool g_torch_libuv = false;

c10d::TCPStoreOptions torchStoreOptions() {
  c10d::TCPStoreOptions options;
#if TORCH_VERSION_MAJOR >= 2
  options.useLibUV = g_torch_libuv;
#endif
  return options;
}

// One server under test, started fresh for each measurement.
class Server {
 public:
  virtual ~Server() = default;
  virtual uint16_t port() const = 0;
  virtual size_t connections() const { return 0; }  // 0: not known
};

class OurServer final : public Server {
 public:
  OurServer() {
    ddprun::rendezvous::StoreServerOptions options;
    options.host = kHost;
    options.port = 0;
    server_ = std::make_unique<ddprun::rendezvous::StoreServer>(options);
  }
  uint16_t port() const override { return static_cast<uint16_t>(server_->port()); }
  size_t connections() const override { return server_->connectionCount(); }

 private:
  std::unique_ptr<ddprun::rendezvous::StoreServer> server_;
};

// torch's server is the master daemon a c10d::TCPStore starts when isServer=true. That store
// also opens its own two client connections to the daemon; they stay idle here.
class TorchServer final : public Server {
 public:
  TorchServer() {
    c10d::TCPStoreOptions options = torchStoreOptions();
    options.port = 0;
    options.isServer = true;
    options.waitWorkers = false;
    options.timeout = std::chrono::seconds(30);
    store_ = c10::make_intrusive<c10d::TCPStore>(kHost, options);
  }
  uint16_t port() const override { return store_->getPort(); }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

std::unique_ptr<Server> startServer(bool ours) {
  if (ours) return std::make_unique<OurServer>();
  return std::make_unique<TorchServer>();
}

c10::intrusive_ptr<c10d::TCPStore> connectClient(uint16_t port, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options = torchStoreOptions();
  options.port = port;
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(kHost, options);
}

// A 64-byte value that differs per thread and per key.
Bytes valueFor(int thread, uint64_t i) {
  Bytes v(kValueBytes);
  for (size_t b = 0; b < kValueBytes; ++b) v[b] = static_cast<uint8_t>('a' + (thread * 7 + i * 13 + b) % 26);
  std::snprintf(reinterpret_cast<char*>(v.data()), kValueBytes, "t%d/i%llu/", thread,
                static_cast<unsigned long long>(i));
  return v;
}

// A start line: the main thread releases every waiting worker at once (one use).
class Gate {
 public:
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }
  void pass() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

struct ThroughputResult {
  uint64_t pairs = 0;
  uint64_t wrong = 0;
  double seconds = 0;
  double server_cpu = 0;  // CPU seconds of everything but the client threads: the server thread
  double client_cpu = 0;  // CPU seconds of the client threads
  double opsPerSecond() const { return 2.0 * static_cast<double>(pairs) / seconds; }
};

ThroughputResult runThroughput(bool ours, const Config& config, int round) {
  auto server = startServer(ours);
  std::vector<c10::intrusive_ptr<c10d::TCPStore>> clients;
  for (int t = 0; t < config.clients; ++t) clients.push_back(connectClient(server->port(), std::chrono::seconds(30)));

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> pairs{0}, wrong{0};
  std::atomic<int> errors{0};
  std::atomic<int64_t> client_cpu_ns{0};
  std::string first_error;
  std::mutex error_mutex;
  Gate gate;
  std::vector<std::thread> threads;
  for (int t = 0; t < config.clients; ++t) {
    threads.emplace_back([&, t] {
      auto& store = *clients[t];
      std::string prefix = "r";  // built piecewise: GCC 12 warns falsely (-Wrestrict) on "r" + to_string()
      prefix += std::to_string(round);
      prefix += "/t";
      prefix += std::to_string(t);
      prefix += "/k";
      uint64_t done = 0, bad = 0;
      gate.pass();
      const double cpu_start = cpuSeconds(CLOCK_THREAD_CPUTIME_ID);
      try {
        while (!stop.load(std::memory_order_relaxed)) {
          const std::string key = prefix + std::to_string(done);
          Bytes value = valueFor(t, done);
          store.set(key, value);
          if (store.get(key) != value) ++bad;
          ++done;
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (errors++ == 0) first_error = e.what();
      }
      client_cpu_ns += static_cast<int64_t>((cpuSeconds(CLOCK_THREAD_CPUTIME_ID) - cpu_start) * 1e9);
      pairs += done;
      wrong += bad;
    });
  }
  const double process_cpu_start = cpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
  auto start = Clock::now();
  gate.open();
  std::this_thread::sleep_for(std::chrono::duration<double>(config.seconds));
  stop = true;
  for (auto& th : threads) th.join();
  ThroughputResult result;
  result.seconds = secondsSince(start);
  result.client_cpu = static_cast<double>(client_cpu_ns.load()) * 1e-9;
  result.server_cpu = cpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - process_cpu_start - result.client_cpu;
  result.pairs = pairs;
  result.wrong = wrong + static_cast<uint64_t>(errors.load());
  if (errors) std::fprintf(stderr, "store_bench: %d client(s) failed, first: %s\n", errors.load(), first_error.c_str());
  clients.clear();
  return result;
}

// A thread with a small stack: a thousand of them must not take gigabytes.
class SmallThread {
 public:
  explicit SmallThread(std::function<void()> fn) : fn_(std::move(fn)) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 512 * 1024);
    int rc = pthread_create(&thread_, &attr, &SmallThread::trampoline, this);
    pthread_attr_destroy(&attr);
    if (rc != 0) throw std::runtime_error(std::string("pthread_create: ") + std::strerror(rc));
  }
  SmallThread(const SmallThread&) = delete;
  SmallThread& operator=(const SmallThread&) = delete;
  void join() { pthread_join(thread_, nullptr); }

 private:
  static void* trampoline(void* self) {
    static_cast<SmallThread*>(self)->fn_();
    return nullptr;
  }
  std::function<void()> fn_;
  pthread_t thread_{};
};

struct WaitResult {
  int served = 0;
  int wrong = 0;  // wrong values, failed connects and timed-out waits
  double connect_seconds = 0;
  double release_seconds = 0;
  double heap_growth_mib = 0;     // heap growth while all clients wait (clients + server)
  size_t server_connections = 0;  // as the server counts them while all wait (0: not known)
  std::string first_error;
};

WaitResult runWaitFanOut(bool ours, int n) {
  const double heap_before = heapInUseMiB();
  auto server = startServer(ours);
  const uint16_t port = server->port();
  const std::string key = "go";
  const Bytes value = valueFor(-1, 42);
  std::atomic<int> ready{0}, served{0}, wrong{0};
  std::atomic<int64_t> last_done_ns{0};
  std::mutex error_mutex;
  WaitResult result;
  Gate gate;

  auto connect_start = Clock::now();
  std::vector<std::unique_ptr<SmallThread>> threads;
  for (int i = 0; i < n; ++i) {
    threads.push_back(std::make_unique<SmallThread>([&, i] {
      gate.pass();
      try {
        auto store = connectClient(port, std::chrono::seconds(30));
        ready++;
        store->wait({key});
        Bytes got = store->get(key);
        auto now = Clock::now().time_since_epoch().count();
        int64_t prev = last_done_ns.load();
        while (prev < now && !last_done_ns.compare_exchange_weak(prev, now)) {
        }
        if (got == value) {
          served++;
        } else {
          wrong++;
        }
      } catch (const std::exception& e) {
        wrong++;
        ready++;
        std::lock_guard<std::mutex> lock(error_mutex);
        if (result.first_error.empty()) result.first_error = "client " + std::to_string(i) + ": " + e.what();
      }
    }));
  }
  gate.open();  // all threads exist: they now connect at the same time
  while (ready.load() < n) std::this_thread::sleep_for(std::chrono::microseconds(200));
  result.connect_seconds = secondsSince(connect_start);
  // Every client has its connection and is about to send WAIT; give the WAITs time to land.
  // A WAIT that arrives after the set is answered at once: still served, the figure only grows.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  result.heap_growth_mib = heapInUseMiB() - heap_before;
  result.server_connections = server->connections();

  auto setter = connectClient(port, std::chrono::seconds(30));
  auto release_start = Clock::now();
  setter->set(key, value);
  for (auto& th : threads) th->join();
  if (last_done_ns.load() != 0) {
    result.release_seconds =
        std::chrono::duration<double>(Clock::time_point(Clock::duration(last_done_ns.load())) - release_start).count();
  }
  result.served = served;
  result.wrong = wrong;
  return result;
}

void raiseFileLimit(int needed) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur >= static_cast<rlim_t>(needed)) return;
  limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, static_cast<rlim_t>(needed));
  setrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_cur < static_cast<rlim_t>(needed)) {
    std::fprintf(stderr, "store_bench: RLIMIT_NOFILE hard limit %llu is below the %d needed\n",
                 static_cast<unsigned long long>(limit.rlim_max), needed);
  }
}

Config parseArgs(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--seconds") {
      c.seconds = std::stod(next());
    } else if (arg == "--rounds") {
      c.rounds = std::stoi(next());
    } else if (arg == "--clients") {
      c.clients = std::stoi(next());
    } else if (arg == "--waiters") {
      c.waiters = std::stoi(next());
    } else if (arg == "--wait-rounds") {
      c.wait_rounds = std::stoi(next());
    } else if (arg == "--no-torch-wait") {
      c.torch_wait = false;
    } else if (arg == "--torch-libuv") {
#if TORCH_VERSION_MAJOR >= 2
      g_torch_libuv = true;
#else
      throw std::invalid_argument("--torch-libuv needs LibTorch 2.x (this is " TORCH_VERSION ")");
#endif
    } else if (arg == "-h" || arg == "--help") {
      std::printf(
          "usage: store_bench [--seconds S] [--rounds R] [--clients N] [--waiters W] [--wait-rounds R]\n"
          "                   [--no-torch-wait] [--torch-libuv]\n"
          "defaults: --seconds 1.0 --rounds 5 --clients 8 --waiters 1024 --wait-rounds 3\n");
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown argument " + arg);
    }
  }
  if (c.seconds <= 0 || c.rounds < 1 || c.clients < 1 || c.waiters < 1 || c.wait_rounds < 1)
    throw std::invalid_argument("bad values");
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  Config config;
  try {
    config = parseArgs(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_bench: error: %s\n", e.what());
    return 2;
  }
  // Per waiter: torch's client opens two connections (store + callback), both ends in this process.
  raiseFileLimit(4 * config.waiters + 256);
  bool ok = true;

  // Throughput.
  std::printf("# store_bench: TCPStore servers, clients = LibTorch %s c10d::TCPStore, %d rounds x %.1f s, medians\n",
              TORCH_VERSION, config.rounds, config.seconds);
  std::printf("# op: set(key_i, %zu B) + get(key_i), get checked; ops/s counts set and get as one op each\n",
              kValueBytes);
  std::printf(
      "#\n#   server  clients  size(B)    count       op   time(us)       ops/s  srv_cpu(us/op)"
      "  cli_cpu(us/op)  wrong\n");
  std::fflush(stdout);
  const char* names[2] = {"ddprun", "torch"};
  std::vector<double> ops[2], lat[2], srv[2], cli[2], counts[2], ratios;
  uint64_t wrong[2] = {0, 0};
  for (int r = 0; r < config.rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      const bool ours = ((r + k) % 2) == 0;  // alternate which server goes first
      const int s = ours ? 0 : 1;
      ThroughputResult res = runThroughput(ours, config, r);
      const double n_ops = 2.0 * static_cast<double>(std::max<uint64_t>(res.pairs, 1));
      ops[s].push_back(res.opsPerSecond());
      lat[s].push_back(res.seconds * config.clients / (n_ops / 2) * 1e6);
      srv[s].push_back(res.server_cpu / n_ops * 1e6);
      cli[s].push_back(res.client_cpu / n_ops * 1e6);
      counts[s].push_back(static_cast<double>(res.pairs));
      wrong[s] += res.wrong;
    }
    ratios.push_back(ops[0].back() / ops[1].back());
  }
  double med_ops[2];
  for (int s = 0; s < 2; ++s) {
    med_ops[s] = median(ops[s]);
    std::printf("%10s %8d %8zu %8.0f  set+get %10.2f %11.0f %15.2f %15.2f %6llu\n", names[s], config.clients,
                kValueBytes, median(counts[s]), median(lat[s]), med_ops[s], median(srv[s]), median(cli[s]),
                static_cast<unsigned long long>(wrong[s]));
    if (wrong[s]) ok = false;
  }
  std::printf("# per round, ddprun ops/s:");
  for (double v : ops[0]) std::printf(" %.0f", v);
  std::printf("; torch ops/s:");
  for (double v : ops[1]) std::printf(" %.0f", v);
  std::printf("; ratio:");
  for (double v : ratios) std::printf(" %.2f", v);
  std::printf("\n# count: set+get pairs in %.1f s; time(us): one pair as one client sees it (mean);\n", config.seconds);
  std::printf(
      "# srv_cpu/cli_cpu: CPU time per op of the server thread / of the client threads (both in this process)\n");
  // ops/s = cores x CPU use / (server + client CPU per op). The clients' share is the same
  // for both servers, so at equal CPU use a cheaper server gains only (C+T)/(C+S); the
  // server-bound figure T/S is what a machine with cores to spare for the clients would show.
  const double cores = std::thread::hardware_concurrency();
  const double srv_ours = median(srv[0]), srv_torch = median(srv[1]);
  const double cli_ours = median(cli[0]), cli_torch = median(cli[1]);
  const double cli_both = (cli_ours + cli_torch) / 2;
  auto use = [&](int s, double srv_us, double cli_us) { return med_ops[s] * (srv_us + cli_us) * 1e-6 / cores; };
  std::printf(
      "# CPU per op, server + clients: ddprun %.2f + %.2f us, torch %.2f + %.2f us; CPU use of the %.0f\n"
      "# cores: ddprun %.0f%%, torch %.0f%%. At equal CPU use the clients' share caps the gain of a cheaper\n"
      "# server at (%.2f + %.2f) / (%.2f + %.2f) = %.2f; server-bound: %.2f / %.2f = %.2f\n",
      srv_ours, cli_ours, srv_torch, cli_torch, cores, 100 * use(0, srv_ours, cli_ours),
      100 * use(1, srv_torch, cli_torch), srv_torch, cli_both, srv_ours, cli_both,
      (srv_torch + cli_both) / (srv_ours + cli_both), srv_torch, srv_ours, srv_torch / srv_ours);
  std::printf("store srv_cpu_ratio=%.2f\n", srv_torch / srv_ours);
  std::printf("store ratio=%.2f\n", median(ratios));
  std::fflush(stdout);

  // Wait fan-out.
  std::printf(
      "\n# wait fan-out: %d concurrent clients, each wait(key) then get(key); key set once all are up;"
      " %d rounds, medians\n",
      config.waiters, config.wait_rounds);
  std::printf("#\n#   server  clients  connect(s)  release(s)  heap(MiB)  served  wrong\n");
  std::fflush(stdout);
  const int servers = config.torch_wait ? 2 : 1;
  std::vector<double> connect_s[2], release_s[2], heap_mib[2];
  int min_served[2] = {config.waiters, config.waiters}, wait_wrong[2] = {0, 0};
  size_t our_connections = 0;
  for (int r = 0; r < config.wait_rounds; ++r) {
    for (int k = 0; k < servers; ++k) {
      const int s = servers == 2 ? (r + k) % 2 : 0;  // alternate which server goes first
      WaitResult w = runWaitFanOut(s == 0, config.waiters);
      if (!w.first_error.empty()) std::fprintf(stderr, "store_bench: %s: %s\n", names[s], w.first_error.c_str());
      connect_s[s].push_back(w.connect_seconds);
      release_s[s].push_back(w.release_seconds);
      heap_mib[s].push_back(w.heap_growth_mib);
      min_served[s] = std::min(min_served[s], w.served);
      wait_wrong[s] += w.wrong;
      if (s == 0) our_connections = std::max(our_connections, w.server_connections);
    }
  }
  double release[2] = {-1, -1};
  for (int s = 0; s < servers; ++s) {
    release[s] = median(release_s[s]);
    std::printf("%10s %8d %11.3f %11.3f %10.1f %7d %6d\n", names[s], config.waiters, median(connect_s[s]), release[s],
                median(heap_mib[s]), min_served[s], wait_wrong[s]);
    if (min_served[s] != config.waiters || wait_wrong[s]) ok = false;
  }
  std::printf("# per round release(s), ddprun:");
  for (double v : release_s[0]) std::printf(" %.3f", v);
  if (servers == 2) {
    std::printf("; torch:");
    for (double v : release_s[1]) std::printf(" %.3f", v);
  }
  std::printf(
      "\n# connect(s): until every client is up; release(s): from the set until the last client's get\n"
      "# returned; heap(MiB): heap growth of this process (server + clients) while all wait;\n"
      "# served: fewest clients served in a round. ddprun's server held %zu connections for %d\n"
      "# clients (LibTorch 1.13's c10d::TCPStore opens 2 each: its store connection and an idle\n"
      "# callback one; this is LibTorch %s)\n",
      our_connections, config.waiters, TORCH_VERSION);
  if (config.torch_wait) {
    std::printf("store_wait clients=%d seconds=%.3f torch_seconds=%.3f\n", config.waiters, release[0], release[1]);
  } else {
    std::printf("store_wait clients=%d seconds=%.3f\n", config.waiters, release[0]);
  }
  return ok ? 0 : 1;
}
