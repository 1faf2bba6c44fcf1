// ddprun_store_server: the agent's store on its own, for tests and benchmarks.
//   ddprun_store_server [--host ADDR] [--port P] [--token-file F]
// Prints "listening on <port>" once ready; runs until SIGINT/SIGTERM.
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/logging.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/store/token_auth.h"

int main(int argc, char** argv) {
  using namespace ddprun;
  configureLogging("ddprun_store_server");
  try {
    rendezvous::StoreServerOptions options;
    std::string token_file;
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw UsageError(arg + " needs a value");
        return argv[++i];
      };
      if (arg == "--host") {
        options.host = value();
      } else if (arg == "--port") {
        options.port = std::stoi(value());
      } else if (arg == "--token-file") {
        token_file = value();
      } else {
        throw UsageError("unknown argument " + arg +
                         " (usage: ddprun_store_server [--host A] [--port P] [--token-file F])");
      }
    }
    options.token = rendezvous::loadToken(token_file);
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before the I/O thread starts
    rendezvous::StoreServer server(options);
    std::printf("listening on %d\n", server.port());
    std::fflush(stdout);
    int received = 0;
    sigwait(&signals, &received);
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "ddprun_store_server: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun_store_server: error: %s\n", e.what());
    return 1;
  }
}
