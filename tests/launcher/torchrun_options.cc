#include "tests/launcher/torchrun_options.h"

#include <cstdlib>
#include <fstream>

#include <catch2/catch.hpp>

#include "common/error.h"
#include "launcher/cli.h"
#include "tests/launcher/parse_args.h"
#include "tests/support/fake_topology.h"
#include "tests/support/scoped_env.h"
#include "tests/support/test_process.h"

namespace ddprun::testing {
namespace {

bool isFlag(TorchAction action) { return action == TorchAction::kCheckEnv || action == TorchAction::kFlag; }

// A value ddprun must take for each of torch's options (parsing only: nothing starts). An
// option of a newer torch has none here and is tried with its default or first choice.
std::string exampleValue(const std::string& dest, const TorchOption& option, const std::string& log_dir) {
  static const std::map<std::string, std::string> examples{
      {"nnodes", "1"},
      {"nproc_per_node", "2"},
      {"rdzv_backend", "static"},
      {"rdzv_endpoint", "localhost:29400"},
      {"rdzv_id", "job7"},
      {"rdzv_conf", "join_timeout=5,last_call_timeout=1"},
      {"max_restarts", "2"},
      {"monitor_interval", "0.5"},
      {"start_method", "fork"},
      {"event_log_handler", "console"},
      {"role", "trainer"},
      {"redirects", "3"},
      {"tee", "1"},
      {"local_ranks_filter", "0"},
      {"node_rank", "0"},
      {"master_addr", "10.0.0.1"},
      {"master_port", "29501"},
      {"local_addr", "127.0.0.1"},
      {"logs_specs", "default"},
      {"numa_binding", "node"},
      {"signals_to_handle", "SIGTERM,SIGUSR1"},
  };
  if (dest == "log_dir") return log_dir;
  if (auto it = examples.find(dest); it != examples.end()) return it->second;
  if (!option.choices.empty()) return option.choices.front();
  return option.fallback.value_or("x");
}

// What follows the flags: the program, as each option needs it.
std::vector<std::string> programFor(const std::string& dest, const std::string& script) {
  if (dest == "module") return {"json.tool"};
  if (dest == "run_path") return {script};
  return {"--no_python", "true"};
}

std::optional<std::string> parseError(std::vector<std::string> args) {
  try {
    parseArgs(std::move(args));
  } catch (const UsageError& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

bool sameDefault(const std::optional<std::string>& torch_default, const std::string& ours) {
  if (!torch_default) return ours.empty();  // None: not given
  if (*torch_default == ours) return true;
  char* end_a = nullptr;
  char* end_b = nullptr;
  const double a = std::strtod(torch_default->c_str(), &end_a);
  const double b = std::strtod(ours.c_str(), &end_b);
  return !torch_default->empty() && !ours.empty() && *end_a == '\0' && *end_b == '\0' && a == b;
}

}  // namespace

const std::map<std::string, std::string>& documentedDefaultDifferences() {
  static const std::map<std::string, std::string> differences{
      {"monitor_interval", "ddprun sees worker exits as they happen: the value (5) is only reported"},
      {"master_port", "unset: a port from the kernel on one node, 29500 on several"},
      {"signals_to_handle", "unset: TORCHELASTIC_SIGNALS_TO_HANDLE, else torch's SIGTERM,SIGINT,SIGHUP,SIGQUIT"},
  };
  return differences;
}

std::string destOf(const TorchOption& option) {
  for (const std::string& name : option.names) {
    if (name.rfind("--", 0) != 0) continue;
    std::string dest = name.substr(2);
    for (char& c : dest) c = c == '-' ? '_' : c;
    return dest;
  }
  return option.names.empty() ? "" : option.names.front().substr(1);
}

void checkTorchOption(const TorchOption& option) {
  const std::string dest = destOf(option);
  INFO("torch's --" << dest);
  // Nothing from the caller's environment may stand in for a value under test.
  std::string pet = "PET_" + dest;
  for (char& c : pet) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  ScopedEnv no_pet(pet, std::nullopt);
  FakeTopology host;
  host.node(0, "0");
  host.node(1, "1");
  host.cpu(0, 0, "0", "0");
  host.cpu(1, 0, "1", "1");
  ScopedEnv topology("DDPRUN_TOPOLOGY_ROOT", host.root());
  ScopedEnv no_gpus("CUDA_VISIBLE_DEVICES", "");
  ScopedEnv python("PYTHON_EXEC", "/bin/sh");
  TempDir dir;
  const std::string script = dir.file("train.py");
  std::ofstream(script) << "\n";

  // One of ddprun's flags has every spelling.
  const std::vector<launcher::LauncherOption> ours = launcher::launcherOptions();
  const launcher::LauncherOption* match = nullptr;
  for (const std::string& name : option.names) {
    const launcher::LauncherOption* owner = nullptr;
    for (const auto& candidate : ours) {
      if (std::find(candidate.names.begin(), candidate.names.end(), name) != candidate.names.end()) owner = &candidate;
    }
    INFO("spelling " << name);
    REQUIRE(owner != nullptr);
    if (match == nullptr) match = owner;
    CHECK(owner == match);
  }
  CHECK(match->torchrun);
  CHECK(match->takes_value == !isFlag(option.action));
  const bool has_pet = option.action == TorchAction::kEnv || option.action == TorchAction::kCheckEnv;
  if (has_pet) CHECK(match->env_name == pet);
  if (dest == "logs_specs") CHECK(match->env_name.empty());

  // The default.
  if (isFlag(option.action)) {
    CHECK(match->default_text == "false");
  } else if (!documentedDefaultDifferences().count(dest)) {
    INFO("torch's default " << option.fallback.value_or("None") << ", ddprun's '" << match->default_text << "'");
    CHECK(sameDefault(option.fallback, match->default_text));
  }

  // Every spelling parses, with a value or as a flag, and sets what the flag means.
  const std::string example = exampleValue(dest, option, dir.path());
  const std::vector<std::string> program = programFor(dest, script);
  for (const std::string& name : option.names) {
    std::vector<std::string> args{name};
    if (!isFlag(option.action)) args.push_back(example);
    args.insert(args.end(), program.begin(), program.end());
    INFO(Catch::Detail::stringify(args));
    CHECK_FALSE(parseError(args));
    if (!parseError(args))
      CHECK(parseArgs(args).flag_values.at("--" + dest) == (isFlag(option.action) ? "true" : example));
  }
  for (const std::string& choice : option.choices) {
    std::vector<std::string> args{option.names.front(), choice};
    args.insert(args.end(), program.begin(), program.end());
    INFO(Catch::Detail::stringify(args));
    CHECK_FALSE(parseError(args));
  }
  // torch's PET_ variable sets it when the flag is absent.
  if (has_pet) {
    ScopedEnv set(pet, isFlag(option.action) ? "1" : example);
    INFO(pet << "=" << (isFlag(option.action) ? "1" : example));
    REQUIRE_FALSE(parseError(program));
    CHECK(parseArgs(program).flag_values.at("--" + dest) == (isFlag(option.action) ? "true" : example));
  }
}

}  // namespace ddprun::testing
