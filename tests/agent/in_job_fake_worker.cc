// A stand-in for a worker on ddprun's runtime under --recovery=in-job, linking only the store
// client: it plays the runtime's part of common/recovery_keys.h's protocol itself, so that the
// agent's side is tested without the runtime.
//
//   in_job_fake_worker RECORD_FILE FAIL_RANK FAIL_GENERATIONS [NOT_CAPABLE_RANK]
//
// Each start appends "start rank=R pid=P generation=G restart=C recovery=M" to RECORD_FILE.
// Every rank but NOT_CAPABLE_RANK writes its `capable` key, then counts itself started. In the
// job's first round (TORCHELASTIC_RESTART_COUNT 0), rank FAIL_RANK exits 3 once every rank has
// started, as long as its generation is below FAIL_GENERATIONS; a newcomer of a later
// generation says so in the store and exits 0; the other ranks wait for the generation to
// reach FAIL_GENERATIONS and that generation's newcomer, then exit 0 (9 when 30 s pass
// first). In later rounds every rank exits 0 once all have started.
#include <fcntl.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>

#include "common/recovery_keys.h"
#include "rendezvous/store/tcp_store_client.h"

namespace {

constexpr auto kPatience = std::chrono::seconds(30);

// A whole number, or exit 2 naming what was not one.
int number(const char* what, const char* text) {
  int value = 0;
  const std::string_view s = text ? text : "";
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size()) {
    std::fprintf(stderr, "in_job_fake_worker: %s '%s' is not a whole number\n", what, text ? text : "(unset)");
    std::exit(2);
  }
  return value;
}

int envInt(const char* name) { return number(name, std::getenv(name)); }

// Polls `done` every 10 ms; false when kPatience passes first.
template <typename Done>
bool waitFor(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s RECORD_FILE FAIL_RANK FAIL_GENERATIONS [NOT_CAPABLE_RANK]\n", argv[0]);
    return 2;
  }
  const std::string record = argv[1];
  const int fail_rank = number("FAIL_RANK", argv[2]);
  const int fail_generations = number("FAIL_GENERATIONS", argv[3]);
  const int not_capable = argc > 4 ? number("NOT_CAPABLE_RANK", argv[4]) : -1;
  const int rank = envInt("RANK");
  const int world = envInt("WORLD_SIZE");
  const int restart = envInt("TORCHELASTIC_RESTART_COUNT");
  const int generation = envInt(ddprun::recovery::kGenerationEnv);
  const char* mode = std::getenv(ddprun::recovery::kRecoveryEnv);

  const std::string line = "start rank=" + std::to_string(rank) + " pid=" + std::to_string(::getpid()) +
                           " generation=" + std::to_string(generation) + " restart=" + std::to_string(restart) +
                           " recovery=" + (mode ? mode : "unset") + "\n";
  const int fd = ::open(record.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 7;
  ::close(fd);

  ddprun::rendezvous::StoreClientOptions options;
  options.host = std::getenv("MASTER_ADDR");
  options.port = envInt("MASTER_PORT");
  options.timeout = kPatience;
  ddprun::rendezvous::TcpStoreClient store(options);
  const std::string scope = ddprun::recovery::roundScope(restart);
  if (rank != not_capable) store.set(ddprun::recovery::capableKey(scope, rank), "1");
  if (generation == 0) store.add(scope + "fake/started", 1);
  const auto everyone = [&] { return store.add(scope + "fake/started", 0) >= world; };

  if (restart > 0) return waitFor(everyone) ? 0 : 9;
  if (rank == fail_rank && generation < fail_generations) {
    if (!waitFor(everyone)) return 9;
    return 3;
  }
  if (generation > 0) {
    store.set(scope + "fake/newcomer/" + std::to_string(generation), std::to_string(::getpid()));
    return 0;
  }
  const std::string generation_key = ddprun::recovery::generationKey(scope);
  const std::string last_newcomer = scope + "fake/newcomer/" + std::to_string(fail_generations);
  const bool recovered =
      waitFor([&] { return store.add(generation_key, 0) >= fail_generations && store.check({last_newcomer}); });
  return recovered ? 0 : 9;
}
