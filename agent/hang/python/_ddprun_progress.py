# ddprun's progress signal for Python workers (agent/hang/python/python_hook.h); written by ddprun.
#
# Every call of torch.distributed's collectives and point-to-point messages is recorded in
# the flight recorder rings that ddprun's C++ runtime keeps (common/flight_ring.h): one
# collective ring and one message ring per process group, files in DDPRUN_FLIGHT_DIR that
# the agent reads while the worker runs, even when it is stuck. The agent's --hang_timeout
# and its hang verdict then judge Python jobs as they judge its own workers: which call each
# rank is in, since when, and which one it completed last.
#
# What is seen: the calls a script makes through torch.distributed (dist.all_reduce,
# dist.barrier, dist.isend ... and the *_object calls), sync and async (an async call is
# pending until its Work completes, from its future where torch gives one, else from
# is_completed looked at every 50 ms); and DDP's gradient all-reduces, which its C++ reducer
# issues unseen inside backward(): each backward() after a syncing DDP forward is one recorded
# all_reduce of the module's group, pending from the end of the backward's computation until
# backward() returns (see _patch_autograd). A communication hook the user registers is
# recorded where it calls torch.distributed. On a GPU (NCCL), where a call returns once its
# work is queued on a stream, a call stays pending until the GPU has done it (a CUDA event
# after it, or its Work's is_completed(), looked at every 50 ms). What is not seen: collectives issued from C++
# otherwise (torch's functional collectives, FSDP's): a hang there is left to torch's timeout.
#
# Nothing here may change what the user's program does: a failure to record is swallowed,
# and the user's call runs as it would have.
import functools
import os
import sys
import threading
import time

_MAGIC = 0x3130524644505444  # "DTPDFR01"
_VERSION = 1
_CAPACITY = 256
_WORDS = 8  # a header, and each slot, is 8 words of 64 bits
_P2P_FLAG = 1
_STARTED, _COMPLETED, _FAILED = 1, 2, 3

# FlightOp codes.
_BROADCAST, _ALL_REDUCE, _REDUCE, _ALL_GATHER, _GATHER, _SCATTER = 1, 2, 3, 4, 5, 6
_REDUCE_SCATTER, _ALL_TO_ALL, _BARRIER, _SEND, _RECV = 7, 8, 9, 10, 11

# name: (op, point_to_point, position of the tensor, of the root or peer, its keyword, of the
# group). None: no such argument. The positions are those of torch 1.13 through 2.11.
_CALLS = {
    "all_reduce": (_ALL_REDUCE, False, 0, None, None, 2),
    "broadcast": (_BROADCAST, False, 0, 1, "src", 2),
    "reduce": (_REDUCE, False, 0, 1, "dst", 3),
    "all_gather": (_ALL_GATHER, False, 1, None, None, 2),
    "all_gather_into_tensor": (_ALL_GATHER, False, 1, None, None, 2),
    "_all_gather_base": (_ALL_GATHER, False, 1, None, None, 2),
    "all_gather_coalesced": (_ALL_GATHER, False, None, None, None, 2),
    "gather": (_GATHER, False, 0, 2, "dst", 3),
    "scatter": (_SCATTER, False, 0, 2, "src", 3),
    "reduce_scatter": (_REDUCE_SCATTER, False, 0, None, None, 3),
    "reduce_scatter_tensor": (_REDUCE_SCATTER, False, 1, None, None, 3),
    "_reduce_scatter_base": (_REDUCE_SCATTER, False, 1, None, None, 3),
    "all_to_all": (_ALL_TO_ALL, False, None, None, None, 2),
    "all_to_all_single": (_ALL_TO_ALL, False, 1, None, None, 4),
    "barrier": (_BARRIER, False, None, None, None, 0),
    "monitored_barrier": (_BARRIER, False, None, None, None, 0),
    "all_gather_object": (_ALL_GATHER, False, None, None, None, 2),
    "broadcast_object_list": (_BROADCAST, False, None, 1, "src", 2),
    "gather_object": (_GATHER, False, None, 2, "dst", 3),
    "scatter_object_list": (_SCATTER, False, None, 2, "src", 3),
    "send": (_SEND, True, 0, 1, "dst", 2),
    "isend": (_SEND, True, 0, 1, "dst", 2),
    "recv": (_RECV, True, 0, 1, "src", 2),
    "irecv": (_RECV, True, 0, 1, "src", 2),
}

_lock = threading.Lock()  # the rings and the group table: calls, future callbacks and the poller
_inside = threading.local()  # a recorded call in progress on this thread (its inner calls are its own)
_dc = None  # torch.distributed.distributed_c10d, once imported
_rings = {}  # (group index, point_to_point) -> _Ring
_groups = {}  # id(process group) -> (index, group): new_group's order, the same on every rank
_next_group = [1]
_failed = [False]  # recording broke once: stop, and say so once
_quiescing = [False]  # _quiesce is registered to run at exit


def _now():
    return time.monotonic_ns()  # CLOCK_MONOTONIC, the agent's steady clock


class _Ring:
    """One ring file, written as FlightRingWriter writes it (seqlock per slot)."""

    def __init__(self, path, rank, group, group_rank, group_size, p2p):
        import mmap
        size = (1 + _CAPACITY) * _WORDS * 8
        # A restarted worker takes over the same name: truncating first zeroes the old ring.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        w = memoryview(self._map).cast("Q")
        self._w = w
        w[1] = _VERSION << 32 | _CAPACITY
        w[2] = rank
        w[3] = group
        w[4] = (group_rank & 0xFFFFFFFF) << 32 | (group_size & 0xFFFFFFFF)
        w[5] = os.getpid()
        w[6] = 0
        w[7] = _P2P_FLAG if p2p else 0
        w[0] = _MAGIC  # last: a reader that sees it sees a whole header
        self._last = 0
        self._slots = [None] * _CAPACITY  # per slot: [seq, op-dtype-root bits, count, started]

    def _write(self, rec, state, ended):
        seq, bits, count, started = rec
        base = (1 + (seq - 1) % _CAPACITY) * _WORDS
        w = self._w
        version = w[base]
        w[base] = version + 1
        w[base + 1] = seq
        w[base + 2] = bits | state << 16
        w[base + 3] = count
        w[base + 4] = started
        w[base + 5] = started
        w[base + 6] = ended
        w[base + 0] = version + 2

    def begin(self, op, dtype, count, root):
        seq = self._last + 1
        self._last = seq
        rec = [seq, op | dtype << 8 | (root & 0xFFFFFFFF) << 32, count, _now()]
        self._slots[(seq - 1) % _CAPACITY] = rec
        self._write(rec, _STARTED, 0)
        self._w[6] = seq  # the newest, after its slot
        return rec

    def end(self, rec, ok):
        if self._slots[(rec[0] - 1) % _CAPACITY] is not rec:
            return  # the ring wrapped past it
        self._write(rec, _COMPLETED if ok else _FAILED, _now())


class _Call:
    """One recorded call: its ring and its record; ends once. `device`: its tensors are on a GPU,
    where a call returns once its work is queued on a stream, not done (see _end_on_device)."""

    __slots__ = ("ring", "rec", "device")

    def __init__(self, ring, rec, device=False):
        self.ring = ring
        self.rec = rec
        self.device = device

    def finish(self, ok):
        with _lock:
            if self.rec is None:
                return
            try:
                self.ring.end(self.rec, ok)
            except Exception:
                pass
            self.rec = None


class _Poller:
    """Works whose completion no callback reports, looked at every 50 ms: gloo's send and recv
    (no future in torch 1.13), and work queued on a GPU (a _DeviceMark, or an NCCL Work, whose
    future completes when the work is queued: is_completed() asks the GPU)."""

    def __init__(self):
        self._cv = threading.Condition()
        self._items = []
        self._thread = None

    def add(self, call, work):
        with self._cv:
            self._items.append((call, work))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ddprun-progress", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self):
        while True:
            with self._cv:
                while not self._items:
                    self._cv.wait()
                items = list(self._items)
            done = set()
            for item in items:
                call, work = item
                try:
                    if not work.is_completed():
                        continue
                    ok = True
                    # NCCL's Work has no is_success in torch 2.x (it raises): a failed NCCL
                    # collective is torch's watchdog's to report.
                    is_success = None if call.device else getattr(work, "is_success", None)
                    if is_success is not None:
                        ok = bool(is_success())
                except Exception:
                    ok = False
                call.finish(ok)
                done.add(id(item))
            if done:
                with self._cv:
                    self._items = [i for i in self._items if id(i) not in done]
            time.sleep(0.05)


_poller = _Poller()


class _DeviceMark:
    """The point a GPU stream has reached: a CUDA event recorded on the current stream, which a
    synchronous collective's work has been made to wait for, so it completes when that
    collective has."""

    __slots__ = ("_event",)

    def __init__(self):
        event = sys.modules["torch"].cuda.Event()
        event.record()
        self._event = event

    def is_completed(self):
        return self._event.query()


def _end_on_device(call, work=None):
    """Ends `call` when its GPU work is done: `work` (an async call's) or, for a synchronous
    call, what the current stream has queued so far. torch returns from a synchronous NCCL
    collective as soon as the stream waits for it, so a rank whose peer never comes keeps
    running and blocks later, elsewhere; the call must stay pending until the GPU finishes it."""
    try:
        _poller.add(call, work if work is not None else _DeviceMark())
    except Exception:
        call.finish(True)  # no way to see the GPU: as recorded before (at return)


_dtype_codes = {}  # torch dtype -> FlightDType code, filled at the first call


def _dtype_code(tensor):
    if not _dtype_codes:
        import torch
        _dtype_codes.update({torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3,
                             torch.int32: 4, torch.int64: 5, torch.uint8: 6})
    code = _dtype_codes.get(tensor.dtype)
    if code is None:
        return 255, tensor.numel() * tensor.element_size()
    return code, tensor.numel()


def _arg(args, kwargs, position, keyword):
    if keyword in kwargs:
        return kwargs[keyword]
    if position is not None and position < len(args):
        return args[position]
    return None


def _group_index(group):
    """(index, process group) of a call's group; index 0 is the default group."""
    dc = _dc
    if group is None or group is getattr(dc.GroupMember, "WORLD", None):
        return 0, None
    known = _groups.get(id(group))
    if known is not None and known[1] is group:
        return known[0]
    # A group made before the hook saw new_group (or another way): numbered on first use.
    index = 1000 + len(_groups)
    _groups[id(group)] = ((index, group), group)
    return index, group


def _ring(index, group, p2p):
    ring = _rings.get((index, p2p))
    if ring is not None:
        return ring
    dc = _dc
    rank = dc.get_rank()
    group_rank = dc.get_rank(group) if group is not None else rank
    group_size = dc.get_world_size(group) if group is not None else dc.get_world_size()
    name = "rank%d.group%d.%s" % (rank, index, "p2pring" if p2p else "ring")
    ring = _Ring(os.path.join(os.environ["DDPRUN_FLIGHT_DIR"], name), rank, index, group_rank, group_size, p2p)
    _rings[(index, p2p)] = ring
    return ring


def _group_rank_of(group, rank):
    if rank is None:
        return -1
    if group is None:
        return int(rank)
    for name in ("get_group_rank", "_get_group_rank"):
        convert = getattr(_dc, name, None)
        if convert is not None:
            try:
                return int(convert(group, rank))
            except Exception:
                return -1
    return -1


def _begin(name, args, kwargs):
    op, p2p, tensor_at, root_at, root_kw, group_at = _CALLS[name]
    dc = _dc
    if not dc.is_initialized():
        return None
    index, group = _group_index(_arg(args, kwargs, group_at, "group"))
    if group is not None and dc.get_rank(group) < 0:
        return None  # not a member: torch returns at once
    dtype, count = 255, 0
    tensor = _arg(args, kwargs, tensor_at, None) if tensor_at is not None else None
    if isinstance(tensor, (list, tuple)):
        tensor = tensor[0] if tensor else None
    if tensor is not None and hasattr(tensor, "numel"):
        dtype, count = _dtype_code(tensor)
    root = -1
    if root_kw is not None:
        group_root = kwargs.get("group_" + root_kw)  # torch 2.6: a rank in the group itself
        root = int(group_root) if group_root is not None else _group_rank_of(group, _arg(args, kwargs, root_at, root_kw))
    device = bool(getattr(tensor, "is_cuda", False))
    with _lock:
        ring = _ring(index, group, p2p)
        return _Call(ring, ring.begin(op, dtype, count, root), device)


def _watch(call, work):
    """Ends `call` when the async `work` completes."""
    if call.device:
        _end_on_device(call, work)
        return
    try:
        future = work.get_future()
    except Exception:
        future = None
    if future is not None:
        def done(f):
            with _lock:  # Python on torch's thread: the end of the program waits for it (_quiesce)
                _callbacks[0] += 1
            try:
                f.value()
                call.finish(True)
            except Exception:
                call.finish(False)
            finally:
                with _lock:
                    _callbacks[0] -= 1
                    _callbacks[1] = time.monotonic()
        _quiesce_at_exit()
        try:
            if hasattr(future, "add_done_callback"):
                future.add_done_callback(done)
            else:
                future.then(done)
            return
        except Exception:
            pass
    _poller.add(call, work)


def _say_off(error):
    if not _failed[0]:
        _failed[0] = True
        sys.stderr.write("ddprun: Python progress recording stopped in this worker: %r\n" % (error,))


def _recorded(name, fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if getattr(_inside, "depth", 0) or _failed[0]:
            return fn(*args, **kwargs)
        try:
            rec = _begin(name, args, kwargs)
        except Exception as e:
            _say_off(e)
            rec = None
        if rec is None:
            return fn(*args, **kwargs)
        _inside.depth = 1
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            _inside.depth = 0
            rec.finish(False)
            raise
        _inside.depth = 0
        if result is not None and hasattr(result, "is_completed"):
            _watch(rec, result)  # async_op=True, isend, irecv: pending until its work completes
        elif rec.device:
            _end_on_device(rec)
        else:
            rec.finish(True)
        return result

    call.__ddprun_recorded__ = True
    return call


def _numbered_new_group(fn):
    # Every rank calls new_group in the same order (torch requires it), members or not: the
    # count is the group's number on every rank, as in ddprun's runtime.
    @functools.wraps(fn)
    def new_group(*args, **kwargs):
        group = fn(*args, **kwargs)
        with _lock:
            index = _next_group[0]
            _next_group[0] += 1
            if group is not None and group is not getattr(_dc.GroupMember, "NON_GROUP_MEMBER", None):
                _groups[id(group)] = ((index, group), group)
        return group

    new_group.__ddprun_recorded__ = True
    return new_group


def _patch(module):
    global _dc
    _dc = module
    for name in _CALLS:
        fn = getattr(module, name, None)
        if fn is not None and callable(fn) and not getattr(fn, "__ddprun_recorded__", False):
            setattr(module, name, _recorded(name, fn))
    fn = getattr(module, "new_group", None)
    if fn is not None and not getattr(fn, "__ddprun_recorded__", False):
        module.new_group = _numbered_new_group(fn)


# The callbacks of async calls' futures (_watch) run Python on torch's communication threads.
# One still running while the interpreter shuts down aborts the process (torch's futures, 1.13
# and 2.6 alike), so the end of the program waits for them (_quiesce, at exit).
_callbacks = [0, 0.0]  # running now, when the last one ended (time.monotonic())


def _quiesce_at_exit():
    if not _quiescing[0]:
        import atexit
        atexit.register(_quiesce)
        _quiescing[0] = True


def _quiesce():
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        with _lock:
            running, last = _callbacks
        # A callback that has just returned still holds the interpreter for a moment.
        if running == 0 and time.monotonic() - last > 0.05:
            return
        time.sleep(0.01)


# DDP's gradient all-reduces: torch's reducer issues them from C++ inside backward(), where no
# Python function is called. A Python communication hook would make them visible bucket by
# bucket, but its future's callback runs Python on the communication thread, and handing the
# interpreter lock to it and back costs more than the recording (torch's own Python
# allreduce_hook slows a small job's steps as much). So the reducer keeps its C++ all-reduce,
# and each backward() that follows a forward of a DDP module syncing gradients is recorded as
# one all_reduce of that module's group: started once the backward's computation is done (a
# callback queued from the first node of the graph runs just before the reducer waits for its
# buckets), completed when backward() returns (on a GPU: when the stream has done what was
# queued by then). A rank that never reaches backward() is behind
# a rank that waits there; ranks that compute in backward(), for however long, wait in nothing.
_armed = {}  # id(process group) -> (index, group, dtype, count, device): DDP forwards awaiting their backward


def _ddp_grads(ddp):
    cached = getattr(ddp, "_ddprun_grads", None)
    if cached is None:
        params = [p for p in ddp.module.parameters() if p.requires_grad]
        dtype = _dtype_code(params[0])[0] if params else 255
        device = bool(params and getattr(params[0], "is_cuda", False))
        cached = (dtype, sum(p.numel() for p in params), device)
        ddp._ddprun_grads = cached
    return cached


def _patch_ddp(module):
    ddp = getattr(module, "DistributedDataParallel", None)
    if ddp is None or getattr(ddp.forward, "__ddprun_recorded__", False):
        return
    forward = ddp.forward
    grad_enabled = sys.modules["torch"].is_grad_enabled

    @functools.wraps(forward)
    def recorded_forward(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        if not _failed[0] and self.require_backward_grad_sync and grad_enabled():
            try:
                group = self.process_group
                if id(group) not in _armed:
                    index, group = _group_index(group)
                    _armed[id(group)] = (index, group) + _ddp_grads(self)
            except Exception as e:
                _say_off(e)
        return out

    recorded_forward.__ddprun_recorded__ = True
    ddp.forward = recorded_forward


def _patch_autograd(module):
    backward = getattr(module, "backward", None)
    if backward is None or getattr(backward, "__ddprun_recorded__", False):
        return

    @functools.wraps(backward)
    def recorded_backward(tensors, *args, **kwargs):
        if not _armed:
            return backward(tensors, *args, **kwargs)
        armed = list(_armed.values())
        _armed.clear()
        calls = []

        def begin():
            if calls or _failed[0]:
                return
            try:
                with _lock:
                    for index, group, dtype, count, device in armed:
                        ring = _ring(index, group, False)
                        calls.append(_Call(ring, ring.begin(_ALL_REDUCE, dtype, count, -1), device))
            except Exception as e:
                _say_off(e)

        handle = None
        try:
            root = tensors if hasattr(tensors, "register_hook") else tensors[0]
            if root.grad_fn is not None:
                engine = sys.modules["torch.autograd.variable"].Variable._execution_engine
                handle = root.register_hook(lambda grad: engine.queue_callback(begin))
        except Exception:
            handle = None  # then the wait counts from backward()'s start
        if handle is None:
            begin()
        try:
            result = backward(tensors, *args, **kwargs)
        except BaseException:
            for call in calls:
                call.finish(False)
            raise
        finally:
            if handle is not None:
                handle.remove()
        begin()  # a graph that never reached its hook still synced its gradients
        for call in calls:
            # On a GPU, backward() returns once the stream waits for the all-reduces.
            if call.device:
                _end_on_device(call)
            else:
                call.finish(True)
        return result

    recorded_backward.__ddprun_recorded__ = True
    module.backward = recorded_backward


# Modules patched as they are imported: torch.distributed.distributed_c10d before
# torch.distributed copies its names, so that dist.all_reduce and the module's own calls are
# the recorded ones; DDP's module before anyone makes a DDP module; torch.autograd, whose
# backward() Tensor.backward calls through the module.
_PATCHES = {
    "torch.autograd": _patch_autograd,
    "torch.distributed.distributed_c10d": _patch,
    "torch.nn.parallel.distributed": _patch_ddp,
}


class _Finder:
    def find_spec(self, name, path=None, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            try:
                patch(module)
            except Exception as e:
                _say_off(e)

        spec.loader.exec_module = exec_module
        return spec


def install(record=True, extra=None):
    """Patches the modules as they are imported: this file's recording when `record`, and
    `extra` (module name -> function called with the module once it has run)."""
    patches = dict(_PATCHES) if record else {}
    patches.update(extra or {})
    _PATCHES.clear()
    _PATCHES.update(patches)
    missing = False
    for name, patch in _PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
        else:
            missing = True
    if missing:
        sys.meta_path.insert(0, _Finder())
