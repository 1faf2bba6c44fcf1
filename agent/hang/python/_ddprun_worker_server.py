# torch's worker control plane in every Python worker (agent/hang/python/worker_server.h);
# written by ddprun.
#
# torch 2.4 and later have torch._C._distributed_c10d._WorkerServer: an HTTP server on a Unix
# socket, on a thread of torch's own, that answers POST /handler/<name> with what torch's
# handlers give (dump_traceback: every thread's Python stack; the flight recorder's live trace
# where the process groups keep one; GET /handler/ lists them). torch starts it only inside
# torch.distributed.elastic.control_plane.worker_main() when TORCH_WORKER_SERVER_SOCKET is set,
# which needs a change to the script; ddprun starts it here, once per process, when
# torch.distributed is imported, on a socket in the worker's own directory
# (DDPRUN_PYTHON_STACKS_DIR, inside the run directory of mode 0700), made 0600: torch_ws.<pid>.
# ddprun does not set TORCH_WORKER_SERVER_SOCKET: a script's own worker_main() would then bind
# the same path and fail.
#
# The server lives as long as the process and is never stopped: stopping it joins torch's
# thread, which may be waiting for the interpreter lock the caller holds (a request in flight
# at exit), and in a forked child it would shut the parent's listening socket down. At exit
# only the socket's name is removed. torch logs a warning line when its server starts (and
# three when it stops); the job's stderr is the user's, so that line goes to /dev/null for the
# moment of the call. Nothing here may change what the user's program does: a failure leaves
# one line on stderr.
import os
import sys

_server = []  # the server, never released


def _quiet(fn):
    """Runs fn() with file descriptor 2 on /dev/null: torch's own log line about the server."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.dup2(null, 2)
        finally:
            os.close(null)
        return fn()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def start(_module=None):
    if _server:
        return
    try:
        from torch._C import _distributed_c10d as c10d
    except Exception:
        return  # torch without distributed
    server_class = getattr(c10d, "_WorkerServer", None)
    if server_class is None:
        return  # torch before 2.4
    folder = os.environ.get("DDPRUN_PYTHON_STACKS_DIR")
    if not folder:
        return
    name = "torch_ws.%d" % os.getpid()
    path = os.path.join(folder, name)
    folder_fd = None
    try:
        bind_path = path
        if len(os.fsencode(path)) >= 108:
            # Longer than a socket address holds (a deep --log_dir): bound through the
            # directory's descriptor, as the agent connects (worker_server.cc).
            folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            bind_path = "/proc/self/fd/%d/%s" % (folder_fd, name)
        server = _quiet(lambda: server_class(bind_path))
        os.chmod(path, 0o600)
    except Exception as e:
        sys.stderr.write("ddprun: torch's worker server not started: %r\n" % (e,))
        return
    finally:
        if folder_fd is not None:
            os.close(folder_fd)
    _server.append(server)
    try:
        import ctypes
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(server))  # its destructor would stop it
    except Exception:
        pass
    import atexit
    pid = os.getpid()

    def unlink():
        if os.getpid() == pid:
            try:
                os.unlink(path)
            except OSError:
                pass

    atexit.register(unlink)
