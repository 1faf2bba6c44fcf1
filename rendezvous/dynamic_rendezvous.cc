#include "rendezvous/dynamic_rendezvous.h"

#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "common/logging.h"
#include "common/sha256.h"
#include "rendezvous/local_addresses.h"
#include "rendezvous/rendezvous_env.h"
#include "rendezvous/token_auth.h"

namespace ddprun::rendezvous {
namespace {

using std::chrono::milliseconds;

constexpr int kStaticDefaultPort = 29500;
constexpr int kC10dDefaultPort = 29400;
// The most one read of a quick connection may carry: its keys are round keys and records,
// kilobytes; hang summaries are at most a megabyte (rendezvous/job_board.cc).
constexpr size_t kMaxQuickReplyBytes = 16 << 20;

bool isIpLiteral(const std::string& host) {
  in6_addr buf{};
  return ::inet_pton(AF_INET, host.c_str(), &buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), &buf) == 1;
}

// One participant's entry in a round: "<node name>|<address>|<nproc>".
struct NodeEntry {
  std::string name;
  std::string address;
  int nproc = 0;
};

std::string encode(const NodeEntry& e) { return e.name + "|" + e.address + "|" + std::to_string(e.nproc); }

NodeEntry decode(const std::string& text) {
  NodeEntry e;
  auto a = text.find('|');
  auto b = text.find('|', a == std::string::npos ? a : a + 1);
  if (a == std::string::npos || b == std::string::npos) throw RendezvousError("malformed node entry '" + text + "'");
  e.name = text.substr(0, a);
  e.address = text.substr(a + 1, b - a - 1);
  const char* first = text.data() + b + 1;
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(first, last, e.nproc);
  if (ec != std::errc() || end != last || e.nproc < 1) throw RendezvousError("malformed node entry '" + text + "'");
  return e;
}

}  // namespace

class DynamicRendezvous::Impl {
 public:
  Impl(RendezvousConfig config, int nproc_per_node, RendezvousEnv& env);
  ~Impl() { stopWatching(); }

  RendezvousResult nextRound();
  void watch(std::function<void(RoundEvent)> on_event);
  std::string endRound(const RoundEnd& end);
  void markDone();
  void stopWatching();
  void finish();
  void interrupt();
  void sitOut();
  std::optional<std::string> jobEndedWhileAway();
  std::optional<RoundPlace> currentRound() const;
  JobSite site() const;
  void onKeepAlive(std::function<void()> tick);

  std::unique_ptr<RendezvousEnv> owned_env_;  // etcd's env; the TCP one is never destroyed
  std::string node_name_;
  std::string store_host_;
  int store_port_ = 0;
  std::unique_ptr<HostedStore> host_server_;

 private:
  // Time left until `deadline` on the env's clock; at least 1 ms, so that a wait that
  // starts at the deadline still asks the store once.
  milliseconds remaining(Clock::TimePoint deadline) const {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - clock_.now());
    return left.count() > 0 ? left : milliseconds(1);
  }
  std::string key(int round, const std::string& name) const {
    return prefix_ + "r" + std::to_string(round) + "/" + name;
  }
  // Where this node stands in a round it tried to join.
  struct Seat {
    bool late = false;     // arrived after the round closed: try the next one
    int index = 0;         // 1-based arrival order (static: node_rank + 1)
    int participants = 0;  // nodes in the round
    int rank_base = 0;     // RANK of this node's local rank 0
    int world_size = 0;    // all workers of the round
  };
  Seat join(int round, Clock::TimePoint deadline);
  Seat joinStatic(int round, Clock::TimePoint deadline);
  int restartCountFor(int round);
  void publishWorkerStore(int round, int world_size);
  std::optional<std::string> awaitMaster(int round);
  std::string rpcSecret(int round, int participants) const;
  // The keep-alive hook's tick, if there is one (on the watcher's thread).
  void tickKeepAlive();
  static bool jobOver(const std::string& reason) {
    const auto end = RoundEnd::parse(reason);
    return end && end->endsJob();
  }
  RendezvousError error(int round, const std::string& what) const {
    return RendezvousError(
        fmt::format("round {} of job '{}' (store {}): {}", round, config_.run_id, storeText(), what));
  }

 public:
  // "host:port" of the TCP store; "etcd a:2379,b:2379" for etcd's members.
  std::string storeText() const {
    return store_port_ == 0 && outlives_job_ ? store_host_ : store_host_ + ":" + std::to_string(store_port_);
  }

 private:
  StoreClientOptions clientOptions(milliseconds connect_timeout) const {
    StoreClientOptions o;
    o.host = store_host_;
    o.port = store_port_;
    o.timeout = settings_.read_timeout;
    o.connect_timeout = connect_timeout;
    o.token = token_;
    return o;
  }

  // Sitting out, and the parts beside the rounds: give up within a couple of keep-alive
  // intervals.
  StoreClientOptions quickClientOptions() const {
    StoreClientOptions o = clientOptions(settings_.keep_alive_interval);
    o.timeout = std::min(settings_.read_timeout, 2 * settings_.keep_alive_interval);
    // Records, round keys and hang summaries are kilobytes; a longer value is not read.
    o.max_reply_bytes = kMaxQuickReplyBytes;
    return o;
  }

  RendezvousEnv& env_;
  Clock& clock_;
  RendezvousConfig config_;
  RendezvousSettings settings_;
  int nproc_;
  std::string token_;
  std::string prefix_;
  std::string advertise_address_;
  // The store is not an agent's and outlives the job (etcd): the last node out removes
  // the job's keys (PROTOCOL.md: "etcd").
  bool outlives_job_ = false;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<StoreClient> client_;
  std::unique_ptr<HostedStore> worker_store_;

  // The current round, as this node took part in it.
  bool in_round_ = false;
  int round_ = -1;
  int group_rank_ = 0;
  int participants_ = 0;
  int restart_count_ = 0;
  std::mutex end_mutex_;
  std::string end_reason_;  // of round_, once known

  std::thread watcher_;
  std::unique_ptr<StoreClient> watcher_client_;
  std::atomic<bool> stop_watching_{false};

  std::mutex keep_alive_mutex_;  // held while the hook runs, so that it can be removed safely
  std::function<void()> on_keep_alive_;

  // While sitting out: asks whether the job ended, and gives up quickly when the store is
  // gone (the main client would keep reconnecting for join_timeout).
  std::unique_ptr<StoreClient> away_client_;
  bool sat_out_ = false;  // left its last round for a cooldown and has not joined since
  int final_round_ = -1;  // the round whose end ended the job while this node sat out
};

DynamicRendezvous::Impl::Impl(RendezvousConfig config, int nproc_per_node, RendezvousEnv& env)
    : env_(env),
      clock_(env.clock()),
      config_(std::move(config)),
      settings_(parseRendezvousSettings(config_.conf)),
      nproc_(nproc_per_node),
      log_(logger("rendezvous")) {
  token_ = loadToken(settings_.token_file);
  prefix_ = "rdzv/" + config_.run_id + "/";
  node_name_ = env_.nodeName();
  bool should_host = false;
  bool host_explicit = false;
  // Port 0 asked for: the host takes a port from the kernel and announces it (many jobs on one
  // machine never race for a port); the other nodes cannot guess it.
  bool announce_port = false;
  std::string bind_host = "0.0.0.0";
  if (config_.standalone) {
    store_host_ = "127.0.0.1";
    store_port_ = 0;
    should_host = host_explicit = true;
    bind_host = store_host_;
  } else if (config_.backend == "etcd-v2" || config_.backend == "etcd") {
    // etcd's members are the store: no agent hosts it (rendezvous/etcd/etcd_env.h).
    store_host_ = "etcd " + config_.endpoint;
    outlives_job_ = true;
  } else if (config_.backend == "static") {
    store_host_ = config_.master_addr;
    store_port_ = config_.master_port ? *config_.master_port : (config_.max_nodes == 1 ? 0 : kStaticDefaultPort);
    should_host = host_explicit = config_.node_rank == 0;
    if (isIpLiteral(store_host_) && isLocalAddress(store_host_)) bind_host = store_host_;
    announce_port = config_.master_port == 0;
    if (announce_port && !should_host) {
      throw UsageError(
          "--master_port 0 (a port from the kernel) is for node 0, the store's host; the other nodes "
          "take the port it announces");
    }
  } else {
    splitHostPort(config_.endpoint, store_host_, store_port_, kC10dDefaultPort);
    host_explicit = settings_.is_host.has_value();
    // Only resolve the endpoint (getaddrinfo) when is_host does not already decide.
    should_host = settings_.is_host ? *settings_.is_host : isLocalAddress(store_host_);
    if (store_host_ == "localhost") bind_host = "127.0.0.1";
    if (isIpLiteral(store_host_) && isLocalAddress(store_host_)) bind_host = store_host_;
    announce_port = store_port_ == 0;
    if (announce_port && !should_host) {
      throw UsageError("--rdzv_endpoint " + config_.endpoint +
                       ": port 0 (a port from the kernel) needs this node to host the store (--rdzv_conf "
                       "is_host=true); the other nodes take the port the host announces");
    }
  }
  if (should_host) {
    try {
      StoreServerOptions options;
      options.host = bind_host;
      options.port = store_port_;
      options.token = token_;
      host_server_ = env_.host(options);
      store_port_ = host_server_->port();
      if (store_host_ == "0.0.0.0") store_host_ = "127.0.0.1";
      if (announce_port) {
        log_->info("serving the rendezvous store on {}:{}, a port from the kernel: give it to the other nodes",
                   store_host_, store_port_);
      } else {
        log_->debug("hosting the rendezvous store on {}:{}", bind_host, store_port_);
      }
    } catch (const SystemError& e) {
      // Another agent on this host already serves the endpoint: join it as a client.
      if (host_explicit || e.code() != EADDRINUSE)
        throw RendezvousError(std::string("cannot host the store: ") + e.what());
      log_->debug("rendezvous store {}:{} is already served on this host; joining it", store_host_, store_port_);
    }
  }
  try {
    client_ = env_.connect(clientOptions(settings_.join_timeout));
  } catch (const StoreError& e) {
    throw RendezvousError(e.what());
  }
  advertise_address_ = config_.local_addr.empty() ? client_->localAddress() : config_.local_addr;
}

int DynamicRendezvous::Impl::restartCountFor(int round) {
  int previous_count = 0;
  std::string previous_end;
  if (round == 0) {
    previous_end = "start";
  } else if (in_round_ && round_ == round - 1) {
    std::lock_guard lock(end_mutex_);
    previous_count = restart_count_;
    previous_end = end_reason_;
  }
  if (previous_end.empty()) {
    previous_count = std::stoi(client_->get(key(round - 1, "restarts")));
    previous_end = client_->get(key(round - 1, "end"));
  }
  const auto previous = RoundEnd::parse(previous_end);
  int count = previous_count + (previous && previous->usesRestart() ? 1 : 0);
  // Every participant writes the same value: a SET, which has no reply, rather than a
  // COMPARE_SET (one wake-up fewer per node at the round's close, where all of them wake at once).
  client_->set(key(round, "restarts"), std::to_string(count));
  return count;
}

// Static: the node's place is its --node_rank; the round closes when all N are there.
// N is small in practice, so every node reads every entry to sum the local world sizes.
DynamicRendezvous::Impl::Seat DynamicRendezvous::Impl::joinStatic(int round, Clock::TimePoint deadline) {
  const int n = config_.max_nodes;
  Seat seat;
  seat.index = config_.node_rank + 1;
  seat.participants = n;
  client_->set(key(round, "node/" + std::to_string(seat.index)), encode({node_name_, advertise_address_, nproc_}));
  std::vector<std::string> all;
  for (int i = 1; i <= n; ++i) all.push_back(key(round, "node/" + std::to_string(i)));
  try {
    client_->wait(all, remaining(deadline));
  } catch (const StoreTimeout&) {
    int present = 0;
    for (const auto& k : all) present += client_->check({k}) ? 1 : 0;
    throw error(round, fmt::format("only {} of {} nodes joined within join_timeout ({} s)", present, n,
                                   settings_.join_timeout.count() / 1000));
  }
  auto entries = client_->multiGet(all);
  for (int i = 0; i < n; ++i) {
    int nproc = decode(entries[i]).nproc;
    if (i < seat.index - 1) seat.rank_base += nproc;
    seat.world_size += nproc;
  }
  return seat;
}

// Dynamic: one ADD gives both the arrival order and the prefix sum of local world sizes
// (the counter holds count << 32 | workers), so joining costs O(1) store operations per
// node however large the job: no node ever reads the whole membership.
DynamicRendezvous::Impl::Seat DynamicRendezvous::Impl::join(int round, Clock::TimePoint deadline) {
  if (config_.backend == "static" && !config_.standalone) return joinStatic(round, deadline);
  constexpr int64_t kOneNode = int64_t{1} << 32;
  auto nodesOf = [](int64_t ticket) { return static_cast<int>(ticket >> 32); };
  auto workersOf = [](int64_t ticket) { return static_cast<int>(ticket & 0xffffffff); };
  const std::string closed = key(round, "closed");
  const int min_nodes = config_.standalone ? 1 : config_.min_nodes;
  const int max_nodes = config_.standalone ? 1 : config_.max_nodes;

  Seat seat;
  const int64_t ticket = client_->add(key(round, "count"), kOneNode + nproc_);
  seat.index = nodesOf(ticket);
  seat.rank_base = workersOf(ticket) - nproc_;
  client_->set(key(round, "node/" + std::to_string(seat.index)), encode({node_name_, advertise_address_, nproc_}));
  if (seat.index == max_nodes) {
    client_->compareSet(closed, "", std::to_string(ticket));
  } else if (seat.index >= min_nodes && seat.index < max_nodes) {
    // Last call: whoever's timer fires first closes the round with everyone there by
    // then; once MAX nodes are in, the MAX-th node closes it itself.
    try {
      client_->wait({closed}, std::min(settings_.last_call_timeout, remaining(deadline)));
    } catch (const StoreTimeout&) {
      const int64_t now = client_->add(key(round, "count"), 0);
      if (nodesOf(now) < max_nodes) client_->compareSet(closed, "", std::to_string(now));
    }
  }
  try {
    client_->wait({closed}, remaining(deadline));
  } catch (const StoreTimeout&) {
    const int count = nodesOf(client_->add(key(round, "count"), 0));
    throw error(round, fmt::format("only {} of at least {} nodes joined within join_timeout ({} s)", count, min_nodes,
                                   settings_.join_timeout.count() / 1000));
  }
  const int64_t formed = std::stoll(client_->get(closed));
  seat.participants = nodesOf(formed);
  seat.world_size = workersOf(formed);
  if (seat.index <= seat.participants) return seat;
  // Late: the job formed without us. If it has room, ask it to re-form (scale up);
  // otherwise wait until its round ends for another reason.
  seat.late = true;
  if (seat.participants < max_nodes) {
    log_->info("job is running with {} node(s); asking it to re-form to take this node in", seat.participants);
    const std::string standing = client_->compareSet(key(round, "end"), "", RoundEnd::join(node_name_).format());
    if (sat_out_ && jobOver(standing)) {
      final_round_ = round;
      throw JobEndedError(standing);
    }
  } else {
    log_->info("job is full ({} nodes); waiting for a place", max_nodes);
    try {
      client_->wait({key(round, "end")}, remaining(deadline));
    } catch (const StoreTimeout&) {
      throw error(round, "the job stayed full for join_timeout; no place for this node");
    }
    if (sat_out_) {
      const std::string standing = client_->get(key(round, "end"));
      if (jobOver(standing)) {
        final_round_ = round;
        throw JobEndedError(standing);
      }
    }
  }
  return seat;
}

RendezvousResult DynamicRendezvous::Impl::nextRound() {
  stopWatching();
  worker_store_.reset();
  const auto deadline = clock_.now() + settings_.join_timeout;
  int round = 0;
  try {
    if (sat_out_) {
      if (auto reason = jobEndedWhileAway()) throw JobEndedError(*reason);
    }
    round = in_round_ ? round_ + 1 : static_cast<int>(client_->add(prefix_ + "round", 0));
    // Back from sitting out: the latest round, but never the one this node left.
    if (sat_out_ && round <= round_) round = round_ + 1;
    for (;;) {
      if (round > 0) client_->compareSet(prefix_ + "round", std::to_string(round - 1), std::to_string(round));
      const Seat seat = join(round, deadline);
      if (seat.late) {
        ++round;
        continue;
      }
      RendezvousResult result;
      result.round = round;
      result.group_rank = seat.index - 1;
      result.group_world_size = seat.participants;
      result.rank_base = seat.rank_base;
      result.world_size = seat.world_size;
      result.restart_count = restartCountFor(round);
      if (result.group_rank == 0) publishWorkerStore(round, result.world_size);
      const std::optional<std::string> published = awaitMaster(round);
      if (!published) {
        ++round;  // the round ended before its workers could start: on to the next
        continue;
      }
      const std::string& master = *published;
      auto colon = master.rfind(':');
      result.master_addr = master.substr(0, colon);
      const char* port_end = master.data() + master.size();
      const auto [end, ec] = colon == std::string::npos
                                 ? std::from_chars_result{port_end, std::errc::invalid_argument}
                                 : std::from_chars(master.data() + colon + 1, port_end, result.master_port);
      if (ec != std::errc() || end != port_end || result.master_port < 1 || result.master_port > 65535) {
        throw RendezvousError("round " + std::to_string(round) + ": malformed master address '" + master + "'");
      }
      result.use_agent_store = true;
      result.rpc_secret = rpcSecret(round, seat.participants);

      if (sat_out_) client_->add(prefix_ + "away", -1);
      in_round_ = true;
      sat_out_ = false;
      away_client_.reset();
      round_ = round;
      group_rank_ = result.group_rank;
      participants_ = seat.participants;
      restart_count_ = result.restart_count;
      {
        std::lock_guard lock(end_mutex_);
        end_reason_.clear();
      }
      log_->debug("round {} formed: {} node(s), this node is group rank {}, world size {}", round, seat.participants,
                  result.group_rank, result.world_size);
      return result;
    }
  } catch (const StoreError& e) {
    throw error(round, e.what());
  }
}

// Derived from the token, the secret is the same on every node and never crosses the
// network; on a single node it is random. A multi-node job without a token has no private
// channel: its workers agree on one through the store.
std::string DynamicRendezvous::Impl::rpcSecret(int round, int participants) const {
  std::string material;
  if (!token_.empty()) {
    const auto d = hmacSha256(token_, fmt::format("ddprun-rpc|{}|{}", config_.run_id, round));
    material.assign(reinterpret_cast<const char*>(d.data()), d.size());
  } else if (participants == 1) {
    material = randomNonce() + randomNonce();
  } else {
    return "";
  }
  std::string hex;
  for (unsigned char c : material) hex += fmt::format("{:02x}", c);
  return hex;
}

// Static jobs without a token give the workers the rendezvous store itself, as torchrun
// does (MASTER_PORT = --master_port): then keys the previous round's workers left are wiped
// first, while every node's workers are stopped. Otherwise the group-rank-0 node starts a
// fresh token-free store for the round on its own address.
void DynamicRendezvous::Impl::publishWorkerStore(int round, int world_size) {
  const bool share_rendezvous_store =
      config_.backend == "static" && !config_.standalone && token_.empty() && host_server_;
  if (share_rendezvous_store) {
    for (const auto& stale : client_->listKeys()) {
      if (stale.rfind("rdzv/", 0) != 0) client_->deleteKey(stale);
    }
    client_->set(key(round, "master"), config_.master_addr + ":" + std::to_string(store_port_));
    return;
  }
  StoreServerOptions options;
  options.host = isIpLiteral(advertise_address_) ? advertise_address_ : "0.0.0.0";
  options.expected_clients = static_cast<size_t>(world_size);  // torch 2.x: one connection per rank
  worker_store_ = env_.host(options);
  client_->set(key(round, "master"), advertise_address_ + ":" + std::to_string(worker_store_->port()));
}

// The round's master address, once its group-rank-0 node has published it. That node can die
// between the round's close and the publication, before it keeps alive in the round: the
// others would wait for an address that never comes (and, past read_timeout, every agent of
// the job would fail, the store's host included). So the wait gets the window a silent node
// gets in a round (keep_alive_interval x keep_alive_max_attempt): past it, that node is
// evicted. nullopt, then or when the round ended meanwhile for another reason, sends this node
// to the next round.
std::optional<std::string> DynamicRendezvous::Impl::awaitMaster(int round) {
  const std::string master = key(round, "master");
  const std::string end = key(round, "end");
  const auto window = settings_.keep_alive_interval * settings_.keep_alive_max_attempt;
  const auto give_up = clock_.now() + window;
  for (;;) {
    try {
      // (At least 1 ms: a wait of 0 has no end.)
      client_->wait({master}, std::clamp<std::chrono::milliseconds>(remaining(give_up), std::chrono::milliseconds(1),
                                                                    settings_.keep_alive_interval));
      return client_->get(master);
    } catch (const StoreTimeout&) {
    }
    if (client_->check({end})) {
      log_->info("round {} ended before its workers' store was published ({}); joining the next", round,
                 client_->get(end));
      return std::nullopt;
    }
    if (clock_.now() >= give_up) {
      const std::string name = decode(client_->get(key(round, "node/1"))).name;
      log_->warn("node {} (group rank 0 of round {}) published no workers' store within {:.1f} s; evicting it", name,
                 round, std::chrono::duration<double>(window).count());
      client_->compareSet(end, "", RoundEnd::evict(name).format());
      return std::nullopt;
    }
  }
}

void DynamicRendezvous::Impl::watch(std::function<void(RoundEvent)> on_event) {
  stopWatching();
  stop_watching_ = false;
  try {
    // The watcher's operations are the keep-alives, which torch bounds by heartbeat_timeout.
    StoreClientOptions options = clientOptions(settings_.read_timeout);
    options.timeout = settings_.heartbeat_timeout.value_or(settings_.read_timeout);
    watcher_client_ = env_.connect(options);
  } catch (const StoreError& e) {
    on_event(RoundEvent{RoundEvent::Kind::kStoreLost, round_, e.what()});
    return;
  }
  const int round = round_;
  const int n = participants_;
  const int me = group_rank_;
  watcher_ = std::thread([this, on_event = std::move(on_event), round, n, me] {
    StoreClient& store = *watcher_client_;
    const std::string end = key(round, "end");
    const std::string my_beat = key(round, "hb/" + std::to_string(me));
    const int successor = (me + 1) % n;
    int64_t last_seen = -1;
    int misses = 0;
    // Failed keep-alive attempts in a row (a timed-out or broken store operation). One is not
    // a lost store: a loaded machine can hold a reply past heartbeat_timeout, and the
    // connection is made afresh on the next attempt. The store is lost after as many failures
    // in a row as the others allow this node missed keep-alives (keep_alive_max_attempt); on the
    // store's own host a timeout never counts (the store is in this process: a slow reply is
    // CPU starvation, and taking it for a loss would end the whole job).
    int failures = 0;
    const bool own_store = host_server_ != nullptr;
    try {
      // etcd: keep-alives on a lease (round_liveness.h); TCP: the counters below.
      std::unique_ptr<RoundLiveness> lease;
      if (outlives_job_) {
        RoundLivenessSpec spec;
        spec.own_key = key(round, "alive/" + std::to_string(me));
        if (n > 1) {
          spec.successor_key = key(round, "alive/" + std::to_string(successor));
          spec.successor_name = decode(store.get(key(round, "node/" + std::to_string(successor + 1)))).name;
          spec.evict_reason = RoundEnd::evict(spec.successor_name).format();
        }
        spec.end_key = end;
        spec.keep_alive_interval = settings_.keep_alive_interval;
        spec.ttl = settings_.keep_alive_interval * settings_.keep_alive_max_attempt;
        lease = env_.liveness(spec);
      }
      if (!lease) store.add(my_beat, 1);
      tickKeepAlive();
      for (;;) {
        try {
          try {
            store.wait({end}, settings_.keep_alive_interval);
            std::string reason = store.get(end);
            {
              std::lock_guard lock(end_mutex_);
              end_reason_ = reason;
            }
            if (!stop_watching_) on_event(RoundEvent{RoundEvent::Kind::kEnded, round, reason});
            return;
          } catch (const StoreTimeout&) {
            if (stop_watching_) return;
          }
          if (lease) {
            tickKeepAlive();
            continue;
          }
          store.add(my_beat, 1);
          tickKeepAlive();
          if (n >= 2) {
            // Each node watches the next one's keep-alives: linear cost over the job.
            int64_t seen = store.add(key(round, "hb/" + std::to_string(successor)), 0);
            misses = seen == last_seen ? misses + 1 : 0;
            last_seen = seen;
            if (misses >= settings_.keep_alive_max_attempt) {
              std::string name = decode(store.get(key(round, "node/" + std::to_string(successor + 1)))).name;
              log_->warn("node {} missed {} keep-alives; evicting it", name, misses);
              store.compareSet(end, "", RoundEnd::evict(name).format());
            }
          }
          failures = 0;
        } catch (const StoreError& e) {
          if (stop_watching_) throw;
          const bool timed_out = dynamic_cast<const StoreTimeout*>(&e) != nullptr;
          if (!(own_store && timed_out) && ++failures >= settings_.keep_alive_max_attempt) throw;
          if (own_store && timed_out) {
            log_->warn("keep-alive to this host's own rendezvous store timed out ({}); trying again", e.what());
          } else {
            log_->warn("keep-alive to the rendezvous store failed ({} of {} in a row): {}; trying again", failures,
                       settings_.keep_alive_max_attempt, e.what());
          }
        }
      }
    } catch (const StoreError& e) {
      if (!stop_watching_) on_event(RoundEvent{RoundEvent::Kind::kStoreLost, round, e.what()});
    }
  });
}

void DynamicRendezvous::Impl::stopWatching() {
  stop_watching_ = true;
  if (watcher_client_) watcher_client_->interrupt();
  if (watcher_.joinable()) watcher_.join();
  watcher_client_.reset();
}

std::string DynamicRendezvous::Impl::endRound(const RoundEnd& end) {
  stopWatching();
  const std::string reason = end.format();
  std::string standing;
  try {
    standing = client_->compareSet(key(round_, "end"), "", reason);
  } catch (const StoreError& e) {
    log_->warn("cannot record the end of round {}: {}", round_, e.what());
    standing = reason;
  }
  std::lock_guard lock(end_mutex_);
  end_reason_ = standing;
  return standing;
}

void DynamicRendezvous::Impl::finish() {
  stopWatching();
  const auto deadline = clock_.now() + settings_.close_timeout;
  const bool job_ended = in_round_ || final_round_ >= 0;
  bool last_out = false;
  try {
    if (sat_out_) {
      client_->add(prefix_ + "away", -1);
      sat_out_ = false;
    }
    if (final_round_ >= 0) {
      // The job ended while this node sat out: it has no round to check out of, but as
      // the store's host it still leaves after the last round's participants.
      if (host_server_) client_->wait({key(final_round_, "all_exited")}, remaining(deadline));
    } else if (in_round_) {
      const int64_t n = participants_;
      if (client_->add(key(round_, "exited"), 1) >= n) {
        client_->set(key(round_, "all_exited"), "1");
        last_out = true;
      }
      // The host serves the store: it leaves last, so no peer loses the store while it
      // still reads how the job ended.
      if (host_server_) client_->wait({key(round_, "all_exited")}, remaining(deadline));
    }
    // Nodes sitting out a cooldown look for the job's end once per keep-alive interval;
    // the host gives them two to learn it (a node killed while away costs no more).
    if ((host_server_ || (outlives_job_ && last_out)) && job_ended) {
      const auto away_deadline = std::min(deadline, clock_.now() + 2 * settings_.keep_alive_interval);
      while (client_->add(prefix_ + "away", 0) > 0 && clock_.now() < away_deadline) {
        clock_.sleepFor(milliseconds(20));
      }
    }
    // etcd: nobody's exit takes the store with it; the last node out removes the job's keys.
    if (outlives_job_ && last_out) client_->deletePrefix(prefix_);
  } catch (const StoreError& e) {
    log_->debug("exit barrier of round {}: {}", final_round_ >= 0 ? final_round_ : round_, e.what());
  }
}

void DynamicRendezvous::Impl::interrupt() {
  client_->interrupt();
  stop_watching_ = true;
  if (watcher_client_) watcher_client_->interrupt();
}

void DynamicRendezvous::Impl::tickKeepAlive() {
  std::lock_guard lock(keep_alive_mutex_);
  if (on_keep_alive_) on_keep_alive_();
}

void DynamicRendezvous::Impl::onKeepAlive(std::function<void()> tick) {
  std::lock_guard lock(keep_alive_mutex_);
  on_keep_alive_ = std::move(tick);
}

std::optional<RoundPlace> DynamicRendezvous::Impl::currentRound() const {
  if (!in_round_) return std::nullopt;
  return RoundPlace{round_, group_rank_, participants_};
}

JobSite DynamicRendezvous::Impl::site() const {
  JobSite s;
  s.env = &env_;
  s.store = quickClientOptions();
  s.prefix = prefix_;
  s.node = node_name_;
  s.address = advertise_address_;
  s.keep_alive_interval = settings_.keep_alive_interval;
  s.keep_alive_max_attempt = settings_.keep_alive_max_attempt;
  return s;
}

void DynamicRendezvous::Impl::sitOut() {
  stopWatching();
  worker_store_.reset();
  in_round_ = false;
  // Once per absence, however many times it is prolonged (a GPU still sick after a cooldown):
  // nextRound() and finish() take it back once.
  if (sat_out_) return;
  sat_out_ = true;
  // Counted so that the store's host does not leave before this node learns how the job ended.
  client_->add(prefix_ + "away", 1);
}

std::optional<std::string> DynamicRendezvous::Impl::jobEndedWhileAway() {
  try {
    if (!away_client_) away_client_ = env_.connect(quickClientOptions());
    StoreClient& store = *away_client_;
    const std::string round_key = prefix_ + "round";
    if (!store.check({round_key})) return std::nullopt;
    const int latest = std::stoi(store.get(round_key));
    const std::string end = key(latest, "end");
    if (!store.check({end})) return std::nullopt;
    std::string reason = store.get(end);
    if (!jobOver(reason)) return std::nullopt;
    final_round_ = latest;
    return reason;
  } catch (const StoreError&) {
    away_client_.reset();
    throw;
  }
}

void DynamicRendezvous::Impl::markDone() {
  int64_t done = client_->add(key(round_, "done"), 1);
  if (done >= participants_) client_->compareSet(key(round_, "end"), "", RoundEnd::done().format());
}

DynamicRendezvous::DynamicRendezvous(RendezvousConfig config, int nproc_per_node)
    : DynamicRendezvous(std::move(config), nproc_per_node, RendezvousEnv::real()) {}
DynamicRendezvous::DynamicRendezvous(RendezvousConfig config, int nproc_per_node, RendezvousEnv& env)
    : impl_(std::make_unique<Impl>(std::move(config), nproc_per_node, env)) {}
DynamicRendezvous::DynamicRendezvous(RendezvousConfig config, int nproc_per_node, std::unique_ptr<RendezvousEnv> env)
    : DynamicRendezvous(std::move(config), nproc_per_node, *env) {
  impl_->owned_env_ = std::move(env);
}
DynamicRendezvous::~DynamicRendezvous() = default;
RendezvousResult DynamicRendezvous::nextRound() { return impl_->nextRound(); }
void DynamicRendezvous::watch(std::function<void(RoundEvent)> on_event) { impl_->watch(std::move(on_event)); }
std::string DynamicRendezvous::endRound(const RoundEnd& end) { return impl_->endRound(end); }
void DynamicRendezvous::markDone() { impl_->markDone(); }
void DynamicRendezvous::stopWatching() { impl_->stopWatching(); }
void DynamicRendezvous::finish() { impl_->finish(); }
void DynamicRendezvous::interrupt() { impl_->interrupt(); }
void DynamicRendezvous::sitOut() { impl_->sitOut(); }
std::optional<std::string> DynamicRendezvous::jobEndedWhileAway() { return impl_->jobEndedWhileAway(); }
std::optional<RoundPlace> DynamicRendezvous::currentRound() const { return impl_->currentRound(); }
JobSite DynamicRendezvous::site() const { return impl_->site(); }
void DynamicRendezvous::onKeepAlive(std::function<void()> tick) { impl_->onKeepAlive(std::move(tick)); }
const std::string& DynamicRendezvous::nodeName() const { return impl_->node_name_; }
std::string DynamicRendezvous::storeAddress() const { return impl_->storeText(); }
bool DynamicRendezvous::hostsStore() const { return impl_->host_server_ != nullptr; }

}  // namespace ddprun::rendezvous
