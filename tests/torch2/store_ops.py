# A torch 2.6 worker under ddprun: every operation of torch 2.6's Python TCPStore against the
# workers' store ddprun hands it (MASTER_ADDR:MASTER_PORT), then a pause while the test reads
# the same keys with ddprun's C++ client and torch 1.13's client, and writes some back.
# Prints "ALL OK" and exits 0 when every check held; names each mismatch otherwise.
import os
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
failures = []


def expect(what, got, want):
    if got == want:
        print(f"ok: {what}", flush=True)
    else:
        failures.append(f"{what}: got {got!r}, want {want!r}")
        print(f"MISMATCH: {failures[-1]}", flush=True)


def client(world_size=None):
    # use_libuv only chooses a server's backend; Debian 13's torch refuses the default even for a client.
    return dist.TCPStore(host, port, world_size, False, timedelta(seconds=30), use_libuv=False)


def expect_timeout(what, call, at_least):
    start = time.monotonic()
    try:
        call()
        failures.append(f"{what}: returned instead of timing out")
    except dist.DistStoreError as e:
        elapsed = time.monotonic() - start
        print(f"{what}: timed out after {elapsed:.2f}s: {e}", flush=True)
        expect(f"{what}: honoured its timeout", at_least <= elapsed < 15, True)


# world_size=1 makes the client count itself in (ADD init/ 1), as every worker does.
store = client(world_size=1)
expect("a fresh workers' store holds only the init/ key", store.num_keys(), 1)
store.set("key", "value")
expect("set/get", store.get("key"), b"value")
store.set("bin", b"\x00\xff\x01")
expect("binary value", store.get("bin"), b"\x00\xff\x01")
expect("add", store.add("counter", 5), 5)
expect("add stored as decimal", store.get("counter"), b"5")
expect("add negative", store.add("counter", -7), -2)
expect("compare_set missing key, empty expected", store.compare_set("cs", "", "first"), b"first")
expect("compare_set match", store.compare_set("cs", "first", "second"), b"second")
expect("compare_set mismatch", store.compare_set("cs", "stale", "third"), b"second")
expect("compare_set missing key, expected given", store.compare_set("absent", "guess", "x"), b"guess")
expect("check: a missing key", store.check(["absent"]), False)
store.append("log", "one")
store.append("log", b"\x00two")
expect("append creates, then appends", store.get("log"), b"one\x00two")
store.multi_set(["m1", "m2", "m3"], ["x", b"\x00y", ""])
expect("multi_get", store.multi_get(["m1", "m2", "m3", "key"]), [b"x", b"\x00y", b"", b"value"])
expect("check: all present", store.check(["m1", "m3", "log"]), True)
expect("check: one missing", store.check(["m1", "absent"]), False)
expect("num_keys: init/ key bin counter cs log m1 m2 m3", store.num_keys(), 9)
expect("delete_key", store.delete_key("key"), True)
expect("delete_key of a deleted key", store.delete_key("key"), False)
expect("num_keys after delete", store.num_keys(), 8)
store.wait(["bin", "counter"])
store.wait(["m3"], timedelta(seconds=5))
print("ok: wait on present keys, with and without a timeout", flush=True)

# Waits released by other clients' writes: the server wakes them.
other = client()
for what, key, write in [("set", "late", lambda: other.set("late", "arrived")),
                        ("add", "late-add", lambda: other.add("late-add", 2)),
                        ("append", "late-append", lambda: other.append("late-append", "a")),
                        ("multi_set", "late-m", lambda: other.multi_set(["late-m"], ["m"])),
                        ("compare_set", "late-cs", lambda: other.compare_set("late-cs", "", "c"))]:
    expect(f"{key} is missing before another client's {what}", store.check([key]), False)
    thread = threading.Timer(0.3, write)
    start = time.monotonic()
    thread.start()
    store.wait([key], timedelta(seconds=20))
    thread.join()
    expect(f"a wait released by another client's {what}", time.monotonic() - start >= 0.25, True)

# A wait that times out sends CANCEL_WAIT; torch 2.x keeps using the same connection after it.
expect_timeout("wait with a timeout on a missing key", lambda: store.wait(["never"], timedelta(milliseconds=700)), 0.6)
expect("the same client after its wait timed out", store.get("cs"), b"second")
store.set_timeout(timedelta(milliseconds=700))
expect_timeout("get of a missing key (WAIT, then CANCEL_WAIT)", lambda: store.get("never"), 0.6)
store.set_timeout(timedelta(seconds=30))
expect("the same client after its get timed out", store.get("late"), b"arrived")
# A timed-out wait leaves nothing behind: a later set of that key must not reach this client.
other.set("never", "now")
expect("a key set after the cancelled wait", store.get("never"), b"now")

# Concurrent clients adding to one counter.
def add_many(n):
    c = client()
    for _ in range(n):
        c.add("shared", 1)

threads = [threading.Thread(target=add_many, args=(50,)) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
expect("4 clients x 50 adds", store.add("shared", 0), 200)

# The other side's turn: the test reads these keys and writes its own, then sets cxx-done.
store.set("from-torch2", "hello from torch 2.6")
print(f"store checks done; store at {host}:{port}", flush=True)
store.wait(["cxx-done"], timedelta(seconds=120))
expect("what ddprun's C++ client wrote", store.get("from-ddprun"), b"bytes\x00from ddprun")
expect("what torch 1.13's client wrote", store.get("from-torch-1.13"), b"hello from torch 1.13")
expect("torch 1.13's add on the shared counter", store.add("shared", 0), 210)
expect("torch 1.13's compare_set", store.get("cs"), b"from 1.13")
print("FAILURES" if failures else "ALL OK", flush=True)
sys.exit(1 if failures else 0)
