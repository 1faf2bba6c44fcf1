# ddprun's startup hook for Python workers (agent/hang/python/python_hook.h); written by ddprun.
# It registers faulthandler for a signal so that ddprun can read every thread's traceback
# without stopping the process, saves an uncaught exception's traceback for the failure
# report, has torch.distributed's calls recorded in flight recorder rings that ddprun reads
# (_ddprun_progress.py beside this file), starts torch's worker server where torch has one
# (_ddprun_worker_server.py beside it), and then runs the sitecustomize that would have run
# without it.
import os as _os
import sys as _sys


def _ddprun_hook():
    folder = _os.environ.get("DDPRUN_PYTHON_STACKS_DIR")
    signum = _os.environ.get("DDPRUN_PYTHON_STACKS_SIGNAL")
    if not folder or not signum:
        return
    try:
        import faulthandler
        out = open(_os.path.join(folder, "py_stacks.%d" % _os.getpid()), "w")
        faulthandler.register(int(signum), file=out, all_threads=True, chain=False)
    except Exception:
        pass
    previous = _sys.excepthook

    def excepthook(kind, value, tb):
        try:
            import traceback
            with open(_os.path.join(folder, "py_exception.%d" % _os.getpid()), "w") as f:
                traceback.print_exception(kind, value, tb, file=f)
        except Exception:
            pass
        previous(kind, value, tb)

    _sys.excepthook = excepthook


def _ddprun_off(name):
    return _os.environ.get(name, "1").strip().lower() in ("0", "false", "no", "off")


def _ddprun_progress():
    # Recording: only where the agent watches (a ring directory named, the recorder not turned
    # off). torch's worker server: in the worker's own directory, unless turned off. Both act
    # when torch.distributed is imported, never before: a script without it pays nothing.
    record = bool(_os.environ.get("DDPRUN_FLIGHT_DIR")) and not _ddprun_off("DDPRUN_FLIGHT_RECORDER")
    serve = bool(_os.environ.get("DDPRUN_PYTHON_STACKS_DIR")) and not _ddprun_off("DDPRUN_WORKER_SERVER")
    if not record and not serve:
        return
    try:
        import _ddprun_progress
        extra = {}
        if serve:
            import _ddprun_worker_server
            extra["torch.distributed"] = _ddprun_worker_server.start
        _ddprun_progress.install(record, extra)
    except Exception as e:  # never the user's problem: the job runs as it would without ddprun
        _sys.stderr.write("ddprun: Python progress recording is off in this worker: %r\n" % (e,))


def _ddprun_chain():
    here = _os.path.dirname(_os.path.abspath(__file__))
    mine = [i for i, p in enumerate(_sys.path) if _os.path.abspath(p or _os.curdir) == here]
    # The next one is the one Python would have found had this directory not been there:
    # after it on the path (one before it has run already, and chained to this one).
    rest = _sys.path[mine[0] + 1:] if mine else []
    _sys.path[:] = [p for i, p in enumerate(_sys.path) if i not in mine]
    import importlib.machinery
    import importlib.util
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    _sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_ddprun_hook()
_ddprun_progress()
_ddprun_chain()
