// store_scale_torch_server: torch's own TCPStore server in a process of its own, for
// bench/store_scale: the master daemon that a c10d::TCPStore with isServer=true starts (LibTorch
// as built against: Debian 12's 1.13 in build/). That store also opens its own client
// connection(s) to the daemon; they stay idle.
//   store_scale_torch_server [--host ADDR] [--port P]
// Prints "listening on <port>" once ready; runs until SIGINT/SIGTERM.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

#include <torch/version.h>  // TORCH_VERSION_MAJOR: without it the libuv switch below never compiled in
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

int main(int argc, char** argv) {
  try {
    std::string host = "127.0.0.1";
    int port = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string arg = argv[i];
      if (arg == "--host") {
        host = argv[i + 1];
      } else if (arg == "--port") {
        port = std::stoi(argv[i + 1]);
      } else {
        std::fprintf(stderr, "usage: store_scale_torch_server [--host ADDR] [--port P]\n");
        return 2;
      }
    }
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before the daemon thread starts
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(port);
    options.isServer = true;
    options.waitWorkers = false;
    options.timeout = std::chrono::seconds(600);
#if TORCH_VERSION_MAJOR >= 2
    options.useLibUV = false;
#endif
    auto store = c10::make_intrusive<c10d::TCPStore>(host, options);
    std::printf("listening on %d\n", static_cast<int>(store->getPort()));
    std::fflush(stdout);
    int received = 0;
    sigwait(&signals, &received);
    // The daemon's teardown with many connections open is not what is measured.
    std::fflush(stdout);
    _exit(0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_scale_torch_server: %s\n", e.what());
    return 1;
  }
}
