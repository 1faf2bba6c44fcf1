// Every option of torch 2.11's torchrun (torch/distributed/run.py, get_args_parser), as facts
// written down here, against ddprun's flags (issue 45): spellings, short forms, PET_ variables,
// defaults, choices. The installed torch's own parser is read by
// torchrun_installed_options_test.cc; this table holds the release that machine lacks.
#include <catch2/catch.hpp>

#include "launcher/cli.h"
#include "tests/launcher/torchrun_options.h"

using ddprun::testing::TorchAction;
using ddprun::testing::TorchOption;

namespace {

const TorchAction kEnv = TorchAction::kEnv;
const TorchAction kCheckEnv = TorchAction::kCheckEnv;
const TorchAction kValue = TorchAction::kValue;

// names, action, default (nullopt: None), choices.
const std::vector<TorchOption> kTorch211 = {
    {{"--nnodes"}, kEnv, "1:1", {}},
    {{"--nproc-per-node", "--nproc_per_node"}, kEnv, "1", {}},
    {{"--rdzv-backend", "--rdzv_backend"}, kEnv, "static", {}},
    {{"--rdzv-endpoint", "--rdzv_endpoint"}, kEnv, "", {}},
    {{"--rdzv-id", "--rdzv_id"}, kEnv, "none", {}},
    {{"--rdzv-conf", "--rdzv_conf"}, kEnv, "", {}},
    {{"--standalone"}, kCheckEnv, std::nullopt, {}},
    {{"--max-restarts", "--max_restarts"}, kEnv, "0", {}},
    {{"--monitor-interval", "--monitor_interval"}, kEnv, "0.1", {}},
    {{"--start-method", "--start_method"}, kEnv, "spawn", {"spawn", "fork", "forkserver"}},
    {{"--event-log-handler", "--event_log_handler"}, kEnv, "null", {"null", "console"}},
    {{"--role"}, kEnv, "default", {}},
    {{"-m", "--module"}, kCheckEnv, std::nullopt, {}},
    {{"--no-python", "--no_python"}, kCheckEnv, std::nullopt, {}},
    {{"--run-path", "--run_path"}, kCheckEnv, std::nullopt, {}},
    {{"--log-dir", "--log_dir"}, kEnv, std::nullopt, {}},
    {{"-r", "--redirects"}, kEnv, "0", {}},
    {{"-t", "--tee"}, kEnv, "0", {}},
    {{"--local-ranks-filter", "--local_ranks_filter"}, kEnv, "", {}},
    {{"--node-rank", "--node_rank"}, kEnv, "0", {}},
    {{"--master-addr", "--master_addr"}, kEnv, "127.0.0.1", {}},
    {{"--master-port", "--master_port"}, kEnv, "29500", {}},
    {{"--local-addr", "--local_addr"}, kEnv, std::nullopt, {}},
    {{"--logs-specs", "--logs_specs"}, kValue, std::nullopt, {}},
    {{"--numa-binding", "--numa_binding"}, kValue, std::nullopt, {"node", "socket", "exclusive", "core-complex"}},
    {{"--signals-to-handle", "--signals_to_handle"}, kEnv, "SIGTERM,SIGINT,SIGHUP,SIGQUIT", {}},
};

}  // namespace

TEST_CASE("every option of torch 2.11's torchrun is one of ddprun's flags with torch's meaning", "[cli][torchrun]") {
  for (const TorchOption& option : kTorch211) ddprun::testing::checkTorchOption(option);
}

TEST_CASE("ddprun marks as torchrun's exactly the options of torch 2.11's torchrun", "[cli][torchrun]") {
  // The mark decides which flag a shared prefix means (launcher/option_prefix.h).
  std::set<std::string> marked;
  for (const auto& option : ddprun::launcher::launcherOptions()) {
    if (option.torchrun) marked.insert(option.names.front());
  }
  std::set<std::string> torch;
  for (const TorchOption& option : kTorch211) torch.insert("--" + ddprun::testing::destOf(option));
  CHECK(marked == torch);
}
