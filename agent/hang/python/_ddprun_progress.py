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
import struct
import sys
import threading
import time

_MAGIC = 0x3130524644505444  # "DTPDFR01"
_VERSION = 1
_CAPACITY = 256
_WORDS = 8  # a header, and each slot, is 8 words of 64 bits
_P2P_FLAG = 1
_SLOT = struct.Struct("=6Q")  # a slot's words after its version: seq, meta, count, enqueued, started, ended
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


class _Inside(threading.local):
    depth = 0  # 1 while a recorded call is in progress on this thread (its inner calls are its own)


_inside = _Inside()
_dc = None  # torch.distributed.distributed_c10d, once imported
_rings = {}  # (group index, point_to_point) -> _Ring
_groups = {}  # id(process group) -> (index, group): new_group's order, the same on every rank
_next_group = [1]
_failed = [False]  # recording broke once: stop, and say so once
_quiescing = [False]  # _quiesce is registered to run at exit


_now = time.monotonic_ns  # CLOCK_MONOTONIC, the agent's steady clock


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
        self._slots = [None] * _CAPACITY  # per slot: (seq, op-dtype-root bits, count, started)

    # begin() and end() run at every recorded call: each is one Python frame (no helper) that
    # writes its slot's words in one call between the seqlock's two version writes. A small step
    # feels every line here (bench/python_hook_pieces.py).
    def begin(self, bits, count):
        """Starts a record of the call `bits` (op | dtype << 8 | (uint32 root) << 32) of `count`
        elements; returns it, for end()."""
        seq = self._last + 1
        self._last = seq
        started = _now()
        rec = (seq, bits, count, started)
        slot = (seq - 1) % _CAPACITY
        self._slots[slot] = rec
        base = (slot + 1) * _WORDS
        w = self._w
        version = w[base]
        w[base] = version + 1  # odd: a reader that sees it, or a change of it, reads again
        _SLOT.pack_into(self._map, base * 8 + 8, seq, bits | _STARTED << 16, count, started, started, 0)
        w[base] = version + 2
        w[6] = seq  # the newest, after its slot
        return rec

    def end(self, rec, ok):
        seq, bits, count, started = rec
        slot = (seq - 1) % _CAPACITY
        if self._slots[slot] is not rec:
            return  # the ring wrapped past it
        base = (slot + 1) * _WORDS
        w = self._w
        version = w[base]
        w[base] = version + 1
        _SLOT.pack_into(self._map, base * 8 + 8, seq, bits | (_COMPLETED if ok else _FAILED) << 16, count, started,
                        started, _now())
        w[base] = version + 2


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


def _end(ring, rec, ok):
    """Ends a record of a call that returned (or raised) on this thread."""
    with _lock:
        try:
            ring.end(rec, ok)
        except Exception:
            pass


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
    # What is known of the call ahead of time is in the closure, and the common case (no group,
    # no root, a tensor) runs inline: this runs at every call, and each Python call in it costs
    # a small step microseconds (bench/python_hook_pieces.py).
    op, p2p, tensor_at, root_at, root_kw, group_at = _CALLS[name]

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if _inside.depth or _failed[0]:
            return fn(*args, **kwargs)
        ring = None
        try:
            dc = _dc
            if dc.is_initialized():
                group = kwargs["group"] if "group" in kwargs else args[group_at] if group_at < len(args) else None
                index = 0
                if group is not None:
                    index, group = _group_index(group)
                if group is None or dc.get_rank(group) >= 0:  # not a member: torch returns at once
                    dtype, count, tensor = 255, 0, None
                    if tensor_at is not None and tensor_at < len(args):
                        tensor = args[tensor_at]
                        if isinstance(tensor, (list, tuple)):
                            tensor = tensor[0] if tensor else None
                        if tensor is not None and hasattr(tensor, "numel"):
                            dtype, count = _dtype_code(tensor)
                    root = -1
                    if root_kw is not None:
                        group_root = kwargs.get("group_" + root_kw)  # torch 2.6: a rank in the group itself
                        root = (int(group_root) if group_root is not None
                                else _group_rank_of(group, _arg(args, kwargs, root_at, root_kw)))
                    device = bool(getattr(tensor, "is_cuda", False))
                    with _lock:
                        ring = _rings.get((index, p2p)) or _ring(index, group, p2p)
                        rec = ring.begin(op | dtype << 8 | (root & 0xFFFFFFFF) << 32, count)
        except Exception as e:
            _say_off(e)
            ring = None
        if ring is None:
            return fn(*args, **kwargs)
        _inside.depth = 1
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            _inside.depth = 0
            _end(ring, rec, False)
            raise
        _inside.depth = 0
        if result is not None and hasattr(result, "is_completed"):
            _watch(_Call(ring, rec, device), result)  # async_op=True, isend, irecv: pending until its work completes
        elif device:
            _end_on_device(_Call(ring, rec, device))
        else:
            try:
                with _lock:
                    ring.end(rec, True)
            except Exception:
                pass
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
# one all_reduce of that module's group: started once the backward's computation is done,
# completed when backward() returns (on a GPU: when the stream has done what was queued by
# then). A rank that never reaches backward() is behind a rank that waits there; ranks that
# compute in backward(), for however long, wait in nothing.
#
# The computation's end: a callback queued on autograd's engine during the backward runs once
# every node has run, just before the reducer's own (queued when its last bucket is ready)
# waits for the buckets. It is queued from a hook that autograd calls during the backward: a
# hook on one parameter of each DDP module, registered once (its gradient is computed in every
# syncing backward: DDP fails a step where a parameter has none, unless find_unused_parameters),
# since registering a hook on each backward's root costs a small step more than all the rest
# (bench/python_hook_pieces.py). The root's hook is still used where a parameter's may not run:
# a module with find_unused_parameters, and every backward once one recorded backward() saw no
# parameter's hook (a frozen parameter, a graph that does not reach it).
_armed = {}  # id(process group) -> its _arm: DDP forwards awaiting their backward
_queue_callback = []  # autograd's engine's queue_callback, once found
_running = [None]  # the recorded backward() in progress (its _Backward), else None
_root_hooks = [False]  # True once a recorded backward() saw no parameter's hook: hooks on roots


def _arm(ddp):
    """(id(group), group, index, group or None, op bits, count, device, hooked) of a DDP
    module's backward all_reduce, kept on the module: its forward arms it every step. hooked: a
    parameter of the module has _grad_ready as its hook."""
    group = ddp.process_group
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    dtype = _dtype_code(params[0])[0] if params else 255
    device = bool(params and getattr(params[0], "is_cuda", False))
    index, recorded_group = _group_index(group)
    hooked = ddp.__dict__.get("_ddprun_hook") is not None  # its handle
    if not hooked and params and not getattr(ddp, "find_unused_parameters", True):
        # The last parameter: usually the first gradient computed.
        ddp.__dict__["_ddprun_hook"] = params[-1].register_hook(_grad_ready)
        hooked = True
    arm = (id(group), group, index, recorded_group, _ALL_REDUCE | dtype << 8 | 0xFFFFFFFF << 32,
           sum(p.numel() for p in params), device, hooked)
    ddp.__dict__["_ddprun_arm"] = arm
    return arm


def _grad_ready(grad):
    # A gradient autograd computes in the recorded backward(): the callback queued now runs at
    # the end of its computation (once a backward).
    run = _running[0]
    if run is not None and not run.queued:
        run.queued = True
        try:
            _queue_callback[0](run.begin)
        except Exception:
            run.begin()  # no engine to queue on (or not in its backward): the wait counts from now


def _patch_ddp(module):
    ddp = getattr(module, "DistributedDataParallel", None)
    if ddp is None or getattr(ddp.forward, "__ddprun_recorded__", False):
        return
    forward = ddp.forward
    grad_enabled = sys.modules["torch"].is_grad_enabled

    @functools.wraps(forward)
    def recorded_forward(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        if self.require_backward_grad_sync and grad_enabled() and not _failed[0]:
            try:
                arm = self.__dict__.get("_ddprun_arm")
                if arm is None or arm[1] is not self.process_group:
                    arm = _arm(self)
                if arm[0] not in _armed:
                    _armed[arm[0]] = arm
            except Exception as e:
                _say_off(e)
        return out

    recorded_forward.__ddprun_recorded__ = True
    ddp.forward = recorded_forward


class _Backward:
    """One recorded backward(): the all_reduces of the DDP modules its forwards armed. Made
    without an __init__ (a Python call less a step): the caller sets its three fields."""

    __slots__ = ("armed", "calls", "queued")  # armed: the _arms; calls: (ring, record, device) once begun

    def begin(self):
        if self.calls is not None or _failed[0]:
            return
        calls = self.calls = []
        try:
            with _lock:
                for _, _, index, group, bits, count, device, _ in self.armed:
                    ring = _ring(index, group, False)
                    calls.append((ring, ring.begin(bits, count), device))
        except Exception as e:
            _say_off(e)

    def end(self, ok):
        for ring, rec, device in self.calls or ():
            if device and ok:
                _end_on_device(_Call(ring, rec, device))  # backward() returns once the stream waits
            else:
                _end(ring, rec, ok)


def _patch_autograd(module):
    backward = getattr(module, "backward", None)
    if backward is None or getattr(backward, "__ddprun_recorded__", False):
        return

    @functools.wraps(backward)
    def recorded_backward(tensors, *args, **kwargs):
        if not _armed:
            outer = _running[0]
            if outer is None:
                return backward(tensors, *args, **kwargs)
            # A backward() inside a recorded one (reentrant checkpointing): called from a node
            # of the outer graph, where a callback queued now runs at the outer computation's
            # end; gradients computed in the inner graph would queue it on the inner one.
            _grad_ready(None)
            _running[0] = None
            try:
                return backward(tensors, *args, **kwargs)
            finally:
                _running[0] = outer
        run = _Backward()
        run.armed, run.calls, run.queued = tuple(_armed.values()), None, False
        _armed.clear()
        handle = None
        try:
            if not _queue_callback:
                _queue_callback.append(sys.modules["torch.autograd.variable"].Variable._execution_engine.queue_callback)
            handle = False  # the parameters' hooks
            for arm in run.armed:
                if _root_hooks[0] or not arm[7]:
                    handle = None
                    root = tensors if hasattr(tensors, "register_hook") else tensors[0]
                    if root.grad_fn is not None:
                        handle = root.register_hook(_grad_ready)
                    break
        except Exception:
            handle = None  # then the wait counts from backward()'s start
        if handle is None:
            run.begin()
        outer = _running[0]  # a recorded backward() this one runs in (a DDP forward recomputed in it)
        _running[0] = run
        try:
            result = backward(tensors, *args, **kwargs)
        except BaseException:
            run.end(False)
            raise
        finally:
            _running[0] = outer
            if handle:
                handle.remove()
        if not run.queued and handle is False:
            _root_hooks[0] = True  # no parameter's hook ran: a root's from now on
        run.begin()  # a graph that never reached its hook still synced its gradients
        run.end(True)
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
