"""Prints the options of the installed torch's torchrun (torch.distributed.run's
get_args_parser), one per line, for torchrun_installed_options_test.cc:

    <names, comma-separated>\t<env|check_env|value|flag>\t<default as JSON>\t<choices, comma-separated>

Positionals and --help are left out. torch's env actions take their default from PET_*
variables when the parser is built, so those are removed first."""
import argparse
import json
import os

for name in [n for n in os.environ if n.startswith("PET_")]:
    del os.environ[name]

from torch.distributed.run import get_args_parser  # noqa: E402

for action in get_args_parser()._actions:
    if not action.option_strings or isinstance(action, argparse._HelpAction):
        continue
    kind = type(action).__name__
    flag = action.nargs == 0
    if kind not in ("env", "check_env"):
        kind = "flag" if flag else "value"
    default = action.default
    if flag:
        default = None
    elif default is not None:
        default = str(default)
    choices = ",".join(str(c) for c in action.choices) if action.choices else ""
    print("\t".join([",".join(action.option_strings), kind, json.dumps(default), choices]))
