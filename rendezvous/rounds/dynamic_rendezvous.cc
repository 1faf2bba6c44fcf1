#include "rendezvous/rounds/dynamic_rendezvous.h"

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
#include "rendezvous/rounds/node_entry.h"
#include "rendezvous/rounds/rendezvous_env.h"
#include "rendezvous/store/token_auth.h"

namespace ddprun::rendezvous {
namespace {

using std::chrono::milliseconds;

// The most one read of a quick connection may carry: its keys are round keys and records,
// kilobytes; hang summaries are at most a megabyte (rendezvous/board/job_board.cc).
constexpr size_t kMaxQuickReplyBytes = 16 << 20;

bool isIpLiteral(const std::string& host) {
  in6_addr buf{};
  return ::inet_pton(AF_INET, host.c_str(), &buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), &buf) == 1;
}

bool jobOver(const std::string& reason) {
  const auto end = RoundEnd::parse(reason);
  return end && end->endsJob();
}

}  // namespace

milliseconds DynamicRendezvous::remaining(Clock::TimePoint deadline) const {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - clock_.now());
  return left.count() > 0 ? left : milliseconds(1);
}

std::string DynamicRendezvous::key(int round, const std::string& name) const {
  return prefix_ + "r" + std::to_string(round) + "/" + name;
}

std::string DynamicRendezvous::seatName(StoreClient& store, int round, int seat) const {
  const std::string entry = key(round, "node/" + std::to_string(seat));
  if (store.check({entry})) return decodeEntry(store.get(entry)).name;
  return fmt::format("seat {} of round {}", seat, round);
}

RendezvousError DynamicRendezvous::error(int round, const std::string& what) const {
  return RendezvousError(
      fmt::format("round {} of job '{}' (store {}): {}", round, config_.run_id, backend_->storeText(), what));
}

StoreClientOptions DynamicRendezvous::clientOptions(milliseconds connect_timeout) const {
  StoreClientOptions o;
  o.timeout = settings_.read_timeout;
  o.connect_timeout = connect_timeout;
  o.token = token_;
  return o;
}

StoreClientOptions DynamicRendezvous::quickClientOptions() const {
  StoreClientOptions o = clientOptions(settings_.keep_alive_interval);
  o.timeout = std::min(settings_.read_timeout, 2 * settings_.keep_alive_interval);
  // Records, round keys and hang summaries are kilobytes; a longer value is not read.
  o.max_reply_bytes = kMaxQuickReplyBytes;
  return o;
}

DynamicRendezvous::DynamicRendezvous(RendezvousConfig config, int nproc_per_node, RendezvousEnv& env,
                                     const BackendMaker& make_backend)
    : env_(env),
      clock_(env.clock()),
      config_(std::move(config)),
      settings_(parseRendezvousSettings(config_.conf)),
      nproc_(nproc_per_node),
      log_(logger("rendezvous")) {
  token_ = loadToken(settings_.token_file);
  prefix_ = "rdzv/" + config_.run_id + "/";
  node_name_ = env_.nodeName();
  // The backend hosts the store first where this node serves it.
  backend_ = make_backend(BackendContext{config_, settings_, token_, env_});
  try {
    StoreClientOptions options = clientOptions(settings_.join_timeout);
    // The join is bounded by join_timeout (as torch's c10d handler bounds it): a store that
    // accepts and never answers is given no longer than that (nor than a call's read_timeout).
    options.first_answer_timeout = std::min(settings_.join_timeout, settings_.read_timeout);
    client_ = backend_->connect(options);
  } catch (const StoreError& e) {
    throw RendezvousError(e.what());
  }
  advertise_address_ = config_.local_addr.empty() ? client_->localAddress() : config_.local_addr;
}

int DynamicRendezvous::restartCountFor(int round) {
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
DynamicRendezvous::Seat DynamicRendezvous::joinStatic(int round, Clock::TimePoint deadline) {
  const int n = config_.max_nodes;
  Seat seat;
  seat.index = config_.node_rank + 1;
  seat.participants = n;
  client_->set(key(round, "node/" + std::to_string(seat.index)), encodeEntry({node_name_, advertise_address_, nproc_}));
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
    int nproc = decodeEntry(entries[i]).nproc;
    if (i < seat.index - 1) seat.rank_base += nproc;
    seat.world_size += nproc;
  }
  return seat;
}

// Dynamic: one ADD gives both the arrival order and the prefix sum of local world sizes
// (the counter holds count << 32 | workers), so joining costs O(1) store operations per
// node however large the job: no node ever reads the whole membership.
DynamicRendezvous::Seat DynamicRendezvous::join(int round, Clock::TimePoint deadline) {
  if (backend_->fixedSeats()) return joinStatic(round, deadline);
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
  client_->set(key(round, "node/" + std::to_string(seat.index)), encodeEntry({node_name_, advertise_address_, nproc_}));
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

RendezvousResult DynamicRendezvous::nextRound() {
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
std::string DynamicRendezvous::rpcSecret(int round, int participants) const {
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

// Where the workers use the rendezvous store itself (Backend::sharedWorkersStore: static
// without a token, as torchrun), keys the previous round's workers left are wiped first,
// while every node's workers are stopped. Otherwise the group-rank-0 node starts a fresh
// token-free store for the round on its own address.
void DynamicRendezvous::publishWorkerStore(int round, int world_size) {
  if (const auto shared = backend_->sharedWorkersStore()) {
    for (const auto& stale : client_->listKeys()) {
      if (stale.rfind("rdzv/", 0) != 0) client_->deleteKey(stale);
    }
    client_->set(key(round, "master"), *shared);
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
std::optional<std::string> DynamicRendezvous::awaitMaster(int round) {
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
      const std::string name = seatName(*client_, round, 1);
      log_->warn("node {} (group rank 0 of round {}) published no workers' store within {:.1f} s; evicting it", name,
                 round, std::chrono::duration<double>(window).count());
      client_->compareSet(end, "", RoundEnd::evict(name).format());
      return std::nullopt;
    }
  }
}

std::string DynamicRendezvous::endRound(const RoundEnd& end) {
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

void DynamicRendezvous::finish() {
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
      if (backend_->hostsStore()) client_->wait({key(final_round_, "all_exited")}, remaining(deadline));
    } else if (in_round_) {
      const int64_t n = participants_;
      if (client_->add(key(round_, "exited"), 1) >= n) {
        client_->set(key(round_, "all_exited"), "1");
        last_out = true;
      }
      // The host serves the store: it leaves last, so no peer loses the store while it
      // still reads how the job ended.
      if (backend_->hostsStore()) client_->wait({key(round_, "all_exited")}, remaining(deadline));
    }
    // Nodes sitting out a cooldown look for the job's end once per keep-alive interval;
    // the host (or, on a store that outlives the job, the last node out) gives them two to
    // learn it (a node killed while away costs no more).
    if ((backend_->hostsStore() || (backend_->outlivesJob() && last_out)) && job_ended) {
      const auto away_deadline = std::min(deadline, clock_.now() + 2 * settings_.keep_alive_interval);
      while (client_->add(prefix_ + "away", 0) > 0 && clock_.now() < away_deadline) {
        clock_.sleepFor(milliseconds(20));
      }
    }
    // A store that outlives the job (etcd): nobody's exit takes it with it; the last node
    // out removes the job's keys.
    if (backend_->outlivesJob() && last_out) client_->deletePrefix(prefix_);
  } catch (const StoreError& e) {
    log_->debug("exit barrier of round {}: {}", final_round_ >= 0 ? final_round_ : round_, e.what());
  }
}

void DynamicRendezvous::interrupt() {
  client_->interrupt();
  stop_watching_ = true;
  if (watcher_client_) watcher_client_->interrupt();
}

std::optional<RoundPlace> DynamicRendezvous::currentRound() const {
  if (!in_round_) return std::nullopt;
  return RoundPlace{round_, group_rank_, participants_};
}

JobSite DynamicRendezvous::site() const {
  JobSite s;
  s.backend = backend_.get();
  s.clock = &clock_;
  s.store = quickClientOptions();
  s.prefix = prefix_;
  s.node = node_name_;
  s.address = advertise_address_;
  s.keep_alive_interval = settings_.keep_alive_interval;
  s.keep_alive_max_attempt = settings_.keep_alive_max_attempt;
  return s;
}

void DynamicRendezvous::sitOut() {
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

std::optional<std::string> DynamicRendezvous::jobEndedWhileAway() {
  try {
    if (!away_client_) away_client_ = backend_->connect(quickClientOptions());
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

void DynamicRendezvous::markDone() {
  int64_t done = client_->add(key(round_, "done"), 1);
  if (done >= participants_) client_->compareSet(key(round_, "end"), "", RoundEnd::done().format());
}

DynamicRendezvous::~DynamicRendezvous() { stopWatching(); }

const std::string& DynamicRendezvous::nodeName() const { return node_name_; }
std::string DynamicRendezvous::storeAddress() const { return backend_->storeText(); }
bool DynamicRendezvous::hostsStore() const { return backend_->hostsStore(); }

}  // namespace ddprun::rendezvous
