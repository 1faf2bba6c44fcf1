"""ddprun, the native launcher for distributed PyTorch jobs, as a Python package.

The package carries the self-contained programs in ddprun/bin/. Its console scripts (ddprun,
ddprun-slurm, ddprun_store_server) and ``python -m ddprun`` replace the Python process with the
program (os.execv, not a child process): the program gets the same arguments, receives the
signals sent to that process id and its exit status is the command's.
"""

import os
import signal
import sys

__all__ = ["program_path", "exec_program", "main", "slurm_main", "store_server_main"]

_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


def program_path(name="ddprun"):
    """The installed program's path (ddprun, ddprun_store_server or ddprun-slurm)."""
    return os.path.join(_BIN, name)


def exec_program(name, args):
    """Replaces this process with the program ``name`` given ``args``; returns only on failure."""
    path = program_path(name)
    if name in ("ddprun", "ddprun-slurm") and not os.environ.get("PYTHON_EXEC") and not os.environ.get("PYTHON"):
        # Python workers run under the interpreter that started ddprun, as under torchrun (its
        # sys.executable): this environment's, whether or not it is activated. ddprun itself
        # would take python3 from PATH.
        if sys.executable:
            os.environ["PYTHON_EXEC"] = sys.executable
    # Python ignores SIGPIPE and SIGXFSZ for itself, and an ignored signal stays ignored across
    # exec: put back the default a program started from a shell has (as subprocess does), so
    # ddprun and its workers die of a closed pipe as they would without Python in between.
    for signal_name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, signal_name):
            signal.signal(getattr(signal, signal_name), signal.SIG_DFL)
    try:
        os.execv(path, [path] + list(args))
    except OSError as e:
        sys.stderr.write(f"ddprun: error: cannot run {path}: {e.strerror} (reinstall the ddprun wheel)\n")
        return 127 if isinstance(e, FileNotFoundError) else 126


def main():
    """The ``ddprun`` console script and ``python -m ddprun``."""
    sys.exit(exec_program("ddprun", sys.argv[1:]))


def slurm_main():
    """The ``ddprun-slurm`` console script: ddprun under SLURM (scripts/ddprun-slurm)."""
    sys.exit(exec_program("ddprun-slurm", sys.argv[1:]))


def store_server_main():
    """The ``ddprun_store_server`` console script: the agent's store on its own."""
    sys.exit(exec_program("ddprun_store_server", sys.argv[1:]))
