#include <catch2/catch.hpp>

#include "agent/worker_env.h"

using ddprun::agent::virtualDevice;

TEST_CASE("virtual devices are entries of the inherited list or else the local rank", "[worker_env][unit]") {
  CHECK(virtualDevice(std::nullopt, 0) == "0");
  CHECK(virtualDevice(std::nullopt, 5) == "5");
  CHECK(virtualDevice(std::string("4,6, 7"), 0) == "4");
  CHECK(virtualDevice(std::string("4,6, 7"), 2) == "7");
  CHECK_FALSE(virtualDevice(std::string("4,6,7"), 3));
  CHECK(virtualDevice(std::string("GPU-1a2b,GPU-3c4d"), 1) == "GPU-3c4d");
  CHECK(virtualDevice(std::string(""), 0) == "");
  CHECK_FALSE(virtualDevice(std::string(""), 1));
}

TEST_CASE("virtual_local_rank changes LOCAL_RANK and CUDA_VISIBLE_DEVICES only", "[worker_env][unit]") {
  ddprun::agent::AgentConfig config;
  config.nproc_per_node = 2;
  ddprun::rendezvous::RendezvousResult rdzv;
  rdzv.world_size = 4;
  rdzv.rank_base = 2;
  rdzv.group_rank = 1;
  rdzv.group_world_size = 2;
  auto places = ddprun::agent::assignPlaces(2, rdzv);
  const std::map<std::string, std::string> base{{"CUDA_VISIBLE_DEVICES", "2,3"}, {"HOME", "/root"}};
  auto plain = ddprun::agent::workerEnvironment(base, config, rdzv, places[1], "/tmp/e.json");
  config.virtual_local_rank = true;
  auto virt = ddprun::agent::workerEnvironment(base, config, rdzv, places[1], "/tmp/e.json");
  CHECK(plain.at("LOCAL_RANK") == "1");
  CHECK(plain.at("CUDA_VISIBLE_DEVICES") == "2,3");
  CHECK(virt.at("LOCAL_RANK") == "0");
  CHECK(virt.at("CUDA_VISIBLE_DEVICES") == "3");
  virt["LOCAL_RANK"] = plain.at("LOCAL_RANK");
  virt["CUDA_VISIBLE_DEVICES"] = plain.at("CUDA_VISIBLE_DEVICES");
  CHECK(virt == plain);
  CHECK(plain.at("TORCHELASTIC_SIGNALS_TO_HANDLE") == "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
}
