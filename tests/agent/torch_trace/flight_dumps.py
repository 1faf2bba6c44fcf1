#!/usr/bin/env python3
"""Synthetic torch flight-recorder dumps for the tests of ddprun's dump reader and verdict.

Usage: flight_dumps.py DIR SCENARIO [--style python|torch] [--protocol N] [--prefix P] [--rank R]

Writes one dump per rank, DIR/<prefix><rank>, with the keys and types torch writes
(torch/csrc/distributed/c10d/FlightRecorderDetail.hpp): --style python pickles the dict with
Python's pickle module (protocol 2 to 5); --style torch writes the opcodes torch's own C++
pickler emits (protocol 2, memoized strings, MARK/SETITEMS dicts, LONG1 for 64-bit ints).
Each waiting operation started 10.0 s before the files' modification time, which is set.
--rank R writes rank R's file alone (as a worker does: the e2e tests' fake torch workers).
Plain Python 3, no torch.
"""
import argparse
import os
import pickle
import shutil
import struct
import sys

T0 = 1_700_000_000 * 10**9  # the job's first operation, CLOCK_REALTIME ns
DUMP_AT = T0 + 20 * 10**9  # the files' modification time
WAIT_FROM = DUMP_AT - 10 * 10**9  # a pending operation started then: it waited 10.0 s


def frames(line, name="main", script="/job/train.py"):
    return [
        {"name": "all_reduce", "filename": "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py",
         "line": 2050},
        {"name": "wrapper", "filename": "/usr/lib/python3/dist-packages/torch/distributed/c10d_logger.py",
         "line": 83},
        {"name": name, "filename": script, "line": line},
        {"name": "<module>", "filename": script, "line": 99},
    ]


class Rank:
    """One rank's entries, numbered as torch numbers them."""

    def __init__(self, rank, groups):
        self.rank = rank
        self.entries = []
        self.seq = {}  # group name -> last collective_seq_id
        self.p2p = {}  # group name -> last p2p_seq_id
        self.groups = groups  # name -> (desc, ranks)

    def op(self, name, state="completed", group="0", sizes=((8,),), dtype="Float", line=10, p2p=None,
           out_sizes=None, seq=None):
        desc = self.groups[group][0]
        is_p2p = p2p is not None
        if is_p2p:
            self.p2p[group] = self.p2p.get(group, 0) + 1
        else:
            self.seq[group] = seq if seq is not None else self.seq.get(group, 0) + 1
        rid = len(self.entries)
        created = T0 + rid * 10**8 if state == "completed" else WAIT_FROM
        sizes = [list(s) for s in sizes]
        self.entries.append({
            "record_id": rid,
            "pg_id": int(group) if group.isdigit() else 7,
            "process_group": (group, desc),
            "collective_seq_id": self.seq.get(group, 0),
            "p2p_seq_id": self.p2p.get(group, 0),
            "op_id": rid + 1,
            "profiling_name": "nccl:" + name + (" " + p2p if is_p2p else ""),
            "time_created_ns": created,
            "duration_ms": 0.25 if state == "completed" else None,
            "input_sizes": sizes,
            "input_dtypes": [dtype] * len(sizes),
            "output_sizes": [list(s) for s in out_sizes] if out_sizes is not None else sizes,
            "output_dtypes": [dtype] * len(sizes),
            "state": state,
            "time_discovered_started_ns": created if state != "scheduled" else None,
            "time_discovered_completed_ns": created + 10**6 if state == "completed" else None,
            "retired": state == "completed",
            "timeout_ms": 10000,
            "is_p2p": is_p2p,
            "thread_id": "140000000000000",
            "thread_name": "pt_main_thread",
            "frames": frames(line),
        })
        return self

    def dump(self):
        return {
            "version": "2.10",
            "comm_lib_version": "2.28.9",
            "pg_config": {name: {"name": name, "desc": desc, "ranks": str(list(ranks))}
                          for name, (desc, ranks) in self.groups.items() if self.rank in ranks},
            "pg_status": {"0": {"last_enqueued_collective": self.seq.get("0", 0),
                                "last_started_collective": self.seq.get("0", 0),
                                "last_completed_collective": max(0, self.seq.get("0", 0) - 1)}},
            "entries": self.entries,
        }


def world(n, extra=None):
    groups = {"0": ("default_pg", list(range(n)))}
    groups.update(extra or {})
    return [Rank(r, groups) for r in range(n)]


def scenario(name):
    """rank -> dump dict for a named case."""
    if name == "done":
        ranks = world(2)
        for r in ranks:
            r.op("all_reduce", line=12).op("all_reduce", line=14)
    elif name == "behind":
        # Rank 1 sleeps instead of calling its second all_reduce (the case).
        ranks = world(2)
        ranks[0].op("all_reduce", line=12).op("all_reduce", state="started", line=14)
        ranks[1].op("all_reduce", line=12)
    elif name == "mismatch_op":
        ranks = world(2)
        ranks[0].op("all_reduce", line=12).op("all_reduce", state="started", line=14)
        ranks[1].op("all_reduce", line=12).op("broadcast", state="started", line=20)
    elif name == "mismatch_size":
        ranks = world(3)
        for r in ranks:
            r.op("all_reduce", line=12)
        ranks[0].op("all_reduce", state="started", line=14)
        ranks[1].op("all_reduce", state="started", line=14, sizes=((4,),))
        ranks[2].op("all_reduce", state="started", line=14)
    elif name == "mismatch_dtype":
        ranks = world(2)
        ranks[0].op("all_reduce", line=12).op("all_reduce", state="started", line=14)
        ranks[1].op("all_reduce", line=12).op("all_reduce", state="started", line=14, dtype="Int")
    elif name == "all_wait":
        # Every rank entered the same operation: no rank is behind (a network or GPU fault).
        ranks = world(2)
        for r in ranks:
            r.op("all_reduce", line=12).op("all_reduce", state="started", line=14)
    elif name == "p2p":
        # Rank 0 sends twice to rank 1; rank 1 receives once and then stops.
        ranks = world(2)
        for r in ranks:
            r.op("all_reduce", line=12)
        ranks[0].op("send", p2p="0->1", line=30).op("send", state="started", p2p="0->1", line=31)
        ranks[1].op("recv", p2p="1<-0", line=40)
    elif name == "p2p_size":
        ranks = world(2)
        ranks[0].op("send", state="started", p2p="0->1", line=30, sizes=((16,),))
        ranks[1].op("recv", state="started", p2p="1<-0", line=40, sizes=((8,),))
    elif name == "groups":
        # Rank 2 never calls the tensor-parallel group's all_reduce; rank 1 waits in it, so it
        # never calls the default group's second all_reduce, where rank 0 waits.
        ranks = world(3, {"1": ("tp", [1, 2])})
        for r in ranks:
            r.op("all_reduce", line=12)
        ranks[0].op("all_reduce", state="started", line=14)
        ranks[1].op("all_reduce", group="1", state="started", line=50)
    elif name == "truncated_ring":
        # The ring buffer kept only the newest entries of a long job (record ids from 1000).
        ranks = world(2)
        for r in ranks:
            r.op("all_reduce", line=12, seq=500)
        ranks[0].op("all_reduce", state="started", line=14)
        for r in ranks:
            for e in r.entries:
                e["record_id"] += 1000
    else:
        raise SystemExit(f"flight_dumps.py: unknown scenario {name}")
    return {r.rank: r.dump() for r in ranks}


class TorchPickler:
    """The opcodes of torch::jit::Pickler (torch/csrc/jit/serialization/pickler.cpp) for
    plain IValues: what pickle_str() writes a flight-recorder dump with."""

    def __init__(self, tag_lists=False):
        self.out = bytearray(b"\x80\x02")
        self.memo = {}
        self.tag_lists = tag_lists

    def put(self):
        n = len(self.memo)
        self.out += b"q" + bytes([n]) if n < 256 else b"r" + struct.pack("<I", n)
        return n

    def get(self, n):
        self.out += b"h" + bytes([n]) if n < 256 else b"j" + struct.pack("<I", n)

    def string(self, s):
        if s in self.memo:
            self.get(self.memo[s])
            return
        b = s.encode()
        self.out += b"X" + struct.pack("<I", len(b)) + b
        self.memo[s] = self.put()

    def integer(self, n):
        if 0 <= n < 256:
            self.out += b"K" + bytes([n])
        elif 0 <= n < 65536:
            self.out += b"M" + struct.pack("<H", n)
        elif -2**31 <= n < 2**31:
            self.out += b"J" + struct.pack("<i", n)
        else:
            self.out += b"\x8a\x08" + struct.pack("<q", n)

    def value(self, v):
        if v is None:
            self.out += b"N"
        elif v is True or v is False:
            self.out += b"\x88" if v else b"\x89"
        elif isinstance(v, int):
            self.integer(v)
        elif isinstance(v, float):
            self.out += b"G" + struct.pack(">d", v)
        elif isinstance(v, str):
            self.string(v)
        elif isinstance(v, tuple):
            for x in v:
                self.value(x)
            self.out += {0: b")", 1: b"\x85", 2: b"\x86", 3: b"\x87"}.get(len(v), b"")
            if len(v) > 3:
                raise SystemExit("flight_dumps.py: long tuples are not written by this pickler")
        elif isinstance(v, list):
            ints = self.tag_lists and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
            if ints:
                # A typed List[int]: torch.jit._pickle.build_intlist([...]).
                key = "torch.jit._pickle\nbuild_intlist\n"
                if key in self.memo:
                    self.get(self.memo[key])
                else:
                    self.out += b"c" + key.encode()
                    self.memo[key] = self.put()
                self.out += b"(]("
                for x in v:
                    self.integer(x)
                self.out += b"etR"
                return
            self.out += b"]("
            for x in v:
                self.value(x)
            self.out += b"e"
        elif isinstance(v, dict):
            self.out += b"}"
            if v:
                self.out += b"("
                for k, x in v.items():
                    self.value(k)
                    self.value(x)
                self.out += b"u"
        else:
            raise SystemExit(f"flight_dumps.py: cannot pickle {type(v)}")

    def dumps(self, v):
        self.value(v)
        self.out += b"."
        return bytes(self.out)


def amplifying(name):
    """Pickles built to cost far more memory or time than their size (issue 44): None when
    `name` is none of them. Each is a dump-shaped dict, so that only the reader's bounds stop it."""
    def s(x):
        b = x.encode()
        return b"X" + struct.pack("<I", len(b)) + b

    def entry_head():
        return (s("profiling_name") + s("nccl:all_reduce") + s("collective_seq_id") + b"K\x01" + s("state") +
                s("started") + s("process_group") + s("0") + s("default_pg") + b"\x86")

    head = b"\x80\x02}(" + s("version") + s("2.10") + s("entries") + b"]("
    if name == "memo_bomb":
        # One entry dict with a 100 KB frame name, memoized, named 20,000 times: 140 KB that a
        # reader copying it per entry expands to 2 GB.
        entry = b"}q\x00(" + entry_head() + s("frames") + b"]}(" + s("name") + s("f" * 100_000) + s("filename") + \
            s("/job/train.py") + s("line") + b"K\x0cuau"
        return head + entry + b"h\x00" * 19_999 + b"eu."
    if name == "dup_keys":
        # One entry dict of 100,000 duplicate keys, named by 30,000 entries: 0.46 MB that a
        # reader scanning the dict for each key of each entry takes minutes over.
        entry = b"}q\x00(" + entry_head() + s("op_id") + b"q\x01K\x07q\x02" + b"h\x01h\x02" * 100_000 + b"u"
        return head + entry + b"h\x00" * 29_999 + b"eu."
    if name == "tiny_nones":
        # 64 MB of None, each pushed and popped: a reader keeping a value per opcode needs GBs.
        return b"\x80\x02" + b"N0" * (32 << 20) + b"}."
    if name == "tiny_memos":
        # 96 MB of None memoized and popped: a memo entry per 3 bytes.
        return b"\x80\x04" + b"N\x940" * (32 << 20) + b"}."
    if name == "tiny_lists":
        # 48 MB of empty lists, each appended to the one below: a value and an item per 2 bytes.
        return b"\x80\x02]" + b"]a" * (24 << 20) + b"}."
    return None


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)
    os.utime(path, ns=(DUMP_AT, DUMP_AT))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("scenario")
    p.add_argument("--style", choices=["python", "torch", "torch-tagged"], default="python")
    p.add_argument("--protocol", type=int, default=2)
    p.add_argument("--prefix", default="nccl_trace_rank_")
    p.add_argument("--rank", type=int)
    a = p.parse_args()
    if a.rank is not None:
        # Every rank's file in a directory of its own beside the target, then rank R's moved
        # into place in one rename, as a finished file (a reader never sees it half written).
        work = os.path.join(a.dir, f".flight_dumps.{os.getpid()}")
        argv = [x for x in sys.argv[1:]]
        at = argv.index("--rank")
        del argv[at:at + 2]
        argv[0] = work
        sys.argv[1:] = argv
        try:
            main()
            os.replace(os.path.join(work, f"{a.prefix}{a.rank}"), os.path.join(a.dir, f"{a.prefix}{a.rank}"))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    os.makedirs(a.dir, exist_ok=True)

    def encode(d):
        if a.style == "python":
            return pickle.dumps(d, protocol=a.protocol)
        return TorchPickler(tag_lists=a.style == "torch-tagged").dumps(d)

    path = lambda r: os.path.join(a.dir, f"{a.prefix}{r}")
    hostile = amplifying(a.scenario)
    if hostile is not None:
        # Rank 0's file alone (a one-rank job): it is the reader that is tested.
        write(path(0), hostile)
        return
    bad = {"missing", "corrupt", "truncated", "deep", "huge_string", "evil_global", "not_a_dict", "bad_type"}
    if a.scenario in bad:
        dumps = scenario("behind")
        for r, d in dumps.items():
            write(path(r), encode(d))
        victim = path(1)
        if a.scenario == "missing":
            # Ranks 0 and 2 of three: rank 1's dump is missing.
            os.rename(victim, path(2))
        elif a.scenario == "corrupt":
            # 200 bytes of 0xFF in the middle, longer than any string there: they hit an
            # opcode (0xFF is none) or a length (a wild one).
            data = bytearray(open(victim, "rb").read())
            mid = len(data) // 2
            data[mid:mid + 200] = b"\xff" * 200
            write(victim, bytes(data))
        elif a.scenario == "truncated":
            write(victim, open(victim, "rb").read()[:200])
        elif a.scenario == "deep":
            # A million nested lists, each opened with a MARK.
            write(victim, b"\x80\x02" + b"](" * 1_000_000 + b"e" * 1_000_000 + b".")
        elif a.scenario == "huge_string":
            write(victim, b"\x80\x02X\xff\xff\xff\x7fabc")
        elif a.scenario == "evil_global":
            write(victim, b"\x80\x02cos\nsystem\nX\x0a\x00\x00\x00touch /tmp\x85R.")
        elif a.scenario == "not_a_dict":
            write(victim, pickle.dumps([1, 2, 3], protocol=a.protocol))
        elif a.scenario == "bad_type":
            d = dumps[1]
            d["entries"][0]["collective_seq_id"] = "one"
            write(victim, encode(d))
        return
    for r, d in scenario(a.scenario).items():
        write(path(r), encode(d))


if __name__ == "__main__":
    sys.exit(main())
