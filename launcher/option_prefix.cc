#include "launcher/option_prefix.h"

#include <algorithm>

#include "common/error.h"
#include "common/text_escape.h"

namespace ddprun::launcher {
namespace {

bool startsWith(const std::string& text, const std::string& prefix) {
  return text.size() >= prefix.size() && text.compare(0, prefix.size(), prefix) == 0;
}

// The option a long name (without "--") stands for: its exact owner, else the one option it is
// a prefix of. nullptr when none is.
const CLI::Option* resolveLong(const CLI::App& app, const std::string& arg, const std::string& name,
                               const ArgvRules& rules, std::string& full_name) {
  if (const CLI::Option* exact = app.get_option_no_throw("--" + name)) {
    full_name = name;
    return exact;
  }
  std::vector<const CLI::Option*> options;
  std::vector<std::string> spellings;  // "--a, --b": every matching spelling, as argparse lists them
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& lname : option->get_lnames()) {
      if (!startsWith(lname, name)) continue;
      spellings.push_back("--" + lname);
      if (std::find(options.begin(), options.end(), option) == options.end()) {
        options.push_back(option);
        if (options.size() == 1) full_name = lname;
      }
    }
  }
  if (options.size() > 1) {
    std::vector<const CLI::Option*> preferred;
    for (const CLI::Option* option : options) {
      if (rules.preferred.count(option)) preferred.push_back(option);
    }
    if (preferred.size() != 1) {
      std::string list;
      for (const std::string& spelling : spellings) list += (list.empty() ? "" : ", ") + spelling;
      throw UsageError((rules.command.empty() ? "" : rules.command + ": ") + "ambiguous option: " + printable(arg) +
                       " could match " + list);
    }
    options = preferred;
    for (const std::string& lname : options.front()->get_lnames()) {
      if (startsWith(lname, name)) {
        full_name = lname;
        break;
      }
    }
  }
  return options.empty() ? nullptr : options.front();
}

}  // namespace

std::vector<std::string> normalizeArgv(const CLI::App& app, std::vector<std::string> args, const ArgvRules& rules) {
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string arg = args[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') {
      if (rules.stop_at_positional) break;  // the training script starts here
      continue;
    }
    const bool is_long = arg[1] == '-';
    const auto eq = arg.find('=');
    const CLI::Option* option = nullptr;
    if (is_long) {
      std::string full_name;
      option =
          resolveLong(app, arg, arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2), rules, full_name);
      if (option != nullptr) args[i] = "--" + full_name + (eq == std::string::npos ? "" : arg.substr(eq));
    } else if (arg.size() == 2) {
      option = app.get_option_no_throw(arg);  // "-r 3"; "-r3" carries its value
    }
    if (option == nullptr || option->get_items_expected_min() == 0) continue;  // a flag, or CLI11's error later
    if (!is_long || eq == std::string::npos) {
      ++i;  // its value follows as the next argument
    } else if (eq + 1 == arg.size()) {
      args[i].pop_back();  // "--name=" -> "--name" ""
      args.insert(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, "");
      ++i;
    }
  }
  return args;
}

}  // namespace ddprun::launcher
