#include <catch2/catch.hpp>

#include "agent/worker_env.h"

using namespace ddprun::agent;

TEST_CASE("places are node-major with contiguous global ranks", "[worker_env]") {
  // Node 2 of 3, after nodes with 3 and 5 workers: ranks 8..11 of 12.
  ddprun::rendezvous::RendezvousResult rdzv;
  rdzv.group_rank = 2;
  rdzv.group_world_size = 3;
  rdzv.rank_base = 8;
  rdzv.world_size = 12;
  auto places = assignPlaces(4, rdzv);
  REQUIRE(places.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(places[i].local_rank == i);
    CHECK(places[i].rank == 8 + i);
    CHECK(places[i].world_size == 12);
    CHECK(places[i].local_world_size == 4);
    CHECK(places[i].role_rank == 8 + i);
    CHECK(places[i].role_world_size == 12);
  }
}

TEST_CASE("the environment contract is complete and keeps the user's own settings", "[worker_env]") {
  AgentConfig config;
  config.nproc_per_node = 2;
  config.max_restarts = 3;
  config.role = "trainer";
  config.rendezvous.run_id = "job1";
  ddprun::rendezvous::RendezvousResult rdzv;
  rdzv.master_addr = "127.0.0.1";
  rdzv.master_port = 29555;
  rdzv.world_size = 2;
  rdzv.restart_count = 2;
  rdzv.use_agent_store = true;
  auto places = assignPlaces(2, rdzv);
  auto env =
      workerEnvironment({{"PATH", "/bin"}, {"NCCL_ASYNC_ERROR_HANDLING", "0"}}, config, rdzv, places[1], "/tmp/e.json");
  CHECK(env.at("RANK") == "1");
  CHECK(env.at("LOCAL_RANK") == "1");
  CHECK(env.at("WORLD_SIZE") == "2");
  CHECK(env.at("LOCAL_WORLD_SIZE") == "2");
  CHECK(env.at("GROUP_RANK") == "0");
  CHECK(env.at("GROUP_WORLD_SIZE") == "1");
  CHECK(env.at("ROLE_RANK") == "1");
  CHECK(env.at("ROLE_WORLD_SIZE") == "2");
  CHECK(env.at("ROLE_NAME") == "trainer");
  CHECK(env.at("MASTER_ADDR") == "127.0.0.1");
  CHECK(env.at("MASTER_PORT") == "29555");
  CHECK(env.at("TORCHELASTIC_RESTART_COUNT") == "2");
  CHECK(env.at("TORCHELASTIC_MAX_RESTARTS") == "3");
  CHECK(env.at("TORCHELASTIC_RUN_ID") == "job1");
  CHECK(env.at("TORCHELASTIC_USE_AGENT_STORE") == "True");
  CHECK(env.at("TORCHELASTIC_ERROR_FILE") == "/tmp/e.json");
  CHECK(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "1");
  CHECK(env.at("NCCL_ASYNC_ERROR_HANDLING") == "0");
  CHECK(env.at("OMP_NUM_THREADS") == "1");
  CHECK(env.at("PATH") == "/bin");
}

TEST_CASE("OMP_NUM_THREADS is left alone for one worker or when the user set it", "[worker_env]") {
  AgentConfig config;
  ddprun::rendezvous::RendezvousResult rdzv;
  config.nproc_per_node = 1;
  auto one = workerEnvironment({}, config, rdzv, assignPlaces(1, rdzv)[0], "e");
  CHECK(one.count("OMP_NUM_THREADS") == 0);
  config.nproc_per_node = 2;
  auto user = workerEnvironment({{"OMP_NUM_THREADS", "4"}}, config, rdzv, assignPlaces(2, rdzv)[0], "e");
  CHECK(user.at("OMP_NUM_THREADS") == "4");
  CHECK_FALSE(setsOmpNumThreads({{"OMP_NUM_THREADS", "4"}}, 2));
  CHECK(setsOmpNumThreads({}, 2));
}

TEST_CASE("Python workers get PYTHONFAULTHANDLER=1 unless opted out or already set", "[worker_env]") {
  AgentConfig config;
  ddprun::rendezvous::RendezvousResult rdzv;
  const WorkerPlace place = assignPlaces(1, rdzv)[0];
  config.python_workers = true;
  CHECK(workerEnvironment({}, config, rdzv, place, "e").at("PYTHONFAULTHANDLER") == "1");
  CHECK(workerEnvironment({{"PYTHONFAULTHANDLER", ""}}, config, rdzv, place, "e").at("PYTHONFAULTHANDLER").empty());
  config.python_faulthandler = false;
  CHECK_FALSE(workerEnvironment({}, config, rdzv, place, "e").count("PYTHONFAULTHANDLER"));
  config.python_faulthandler = true;
  config.python_workers = false;
  CHECK_FALSE(workerEnvironment({}, config, rdzv, place, "e").count("PYTHONFAULTHANDLER"));
}
