"""collectives_sweep_torch: torch.distributed's gloo in bench/collectives_sweep's table, with the
rules of bench/collectives_sweep_core.h (the C++ implementations' loop, mirrored line for line).
It starts its own N ranks (fork, rendezvous through a file store), so the same script runs
under Debian's torch 1.13 (/usr/bin/python3) and torch 2.6 (scripts/torch2-python).
Usage: python3 collectives_sweep_torch.py --nproc N [--impl NAME] [--ops a,b] [--min-bytes B]
                                          [--max-bytes B] [--full] [--seconds S] [--timeout S]
                                          [--pin C,C,...]
Rank 0 prints sweep_row lines; an op gloo does not support prints one
"sweep_unsupported impl=.. n=.. op=.." line instead. Exit status 1 when a result was wrong."""
import argparse
import datetime
import math
import multiprocessing
import os
import sys
import tempfile
import time

WARMUPS, MIN_ITERS, MAX_ITERS = 2, 5, 20000
OPS = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"]


def parse_bytes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def parse_cpus(text):
    items = text.split(",")
    if not all(item.isdigit() and len(item) <= 4 for item in items):
        raise argparse.ArgumentTypeError(f"--pin '{text}' (CPU numbers, comma-separated, as 0,1)")
    return [int(item) for item in items]


def sweep_sizes(args):
    sizes, b = [], 8
    while b <= args.max_bytes:
        if b >= args.min_bytes:
            sizes.append(b)
        b *= 4
    if args.min_bytes <= 4096 <= args.max_bytes:
        sizes.append(4096)
    return sorted(sizes)


class Case:
    def __init__(self, torch, dist, op, nbytes):
        self.torch, self.dist, self.op = torch, dist, op
        self.r, self.n = dist.get_rank(), dist.get_world_size()
        elems = max(1, nbytes // 4)
        blocked = op in ("all_gather", "reduce_scatter")
        self.count = 0 if op == "barrier" else (max(1, elems // self.n) if blocked else elems)
        self.bytes = self.count * 4 * (self.n if blocked else 1)
        c, n = self.count, self.n
        pat = (torch.arange(c, dtype=torch.int64) % 13).to(torch.float32)
        self.pattern = pat
        if op in ("all_reduce", "broadcast"):
            self.buf = torch.empty(c)
        elif op == "all_gather":
            self.inp, self.out = torch.empty(c), [torch.empty(c) for _ in range(n)]
        elif op == "reduce_scatter":
            self.inp, self.out = [torch.empty(c) for _ in range(n)], torch.empty(c)

    def bus_factor(self):
        n = self.n
        return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n}.get(self.op, 1)

    def fill(self):
        r, pat = self.r, self.pattern
        if self.op == "all_reduce":
            self.buf.copy_(pat).add_(r)
        elif self.op == "broadcast":
            if r == 0:
                self.buf.copy_(pat).add_(1)
            else:
                self.buf.fill_(-1)
        elif self.op == "all_gather":
            self.inp.copy_(pat).add_(16 * r)
            for t in self.out:
                t.fill_(-1)
        elif self.op == "reduce_scatter":
            for b, t in enumerate(self.inp):
                t.copy_(pat).add_(r + b)
            self.out.fill_(-1)

    def run(self):
        d = self.dist
        if self.op == "all_reduce":
            d.all_reduce(self.buf)
        elif self.op == "broadcast":
            d.broadcast(self.buf, 0)
        elif self.op == "all_gather":
            d.all_gather(self.out, self.inp)
        elif self.op == "reduce_scatter":
            d.reduce_scatter(self.out, self.inp)
        else:
            d.barrier()

    def wrong(self):
        n, r, pat, torch = self.n, self.r, self.pattern, self.torch
        ranks_sum = n * (n - 1) // 2
        if self.op == "all_reduce":
            return not torch.equal(self.buf, pat * n + ranks_sum)
        if self.op == "broadcast":
            return not torch.equal(self.buf, pat + 1)
        if self.op == "all_gather":
            return any(not torch.equal(t, pat + 16 * q) for q, t in enumerate(self.out))
        if self.op == "reduce_scatter":
            return not torch.equal(self.out, pat * n + ranks_sum + n * r)
        return False

    def timed_call(self):
        self.fill()
        self.dist.barrier()
        t0 = time.perf_counter()
        self.run()
        return time.perf_counter() - t0


def rank_main(rank, args, store_path, status):
    if args.pin:
        # Before torch starts its threads, which inherit the CPU (see the C++ core's --pin).
        os.sched_setaffinity(0, {args.pin[rank % len(args.pin)]})
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # A bounded wait: a rank that hangs fails its peers within a minute instead of 30.
    dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank, world_size=args.nproc,
                            timeout=datetime.timedelta(seconds=60))
    n = args.nproc
    if args.pin:
        cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
        # One write(2) for the whole line: print() may write the text and its newline apart
        # (unbuffered stdout), and the ranks' lines then interleave on the shared pipe.
        sys.stdout.flush()
        os.write(1, f"sweep_pinned impl={args.impl} n={n} rank={rank} cpus={cpus}\n".encode())

    def max_over_ranks(values):
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    wrong_total = 0
    for op in args.ops:
        for size in ([0] if op == "barrier" else sweep_sizes(args)):
            c = Case(torch, dist, op, size)
            try:
                est = [c.timed_call() for _ in range(WARMUPS)][-1]
            except RuntimeError as e:  # e.g. torch 1.13's gloo has no reduce_scatter
                if rank == 0:
                    print(f"sweep_unsupported impl={args.impl} n={n} op={op} ({str(e).splitlines()[0]})", flush=True)
                break
            est = max_over_ranks([est])[0]
            iters = int(min(max(math.ceil(args.seconds / max(est, 1e-9)), MIN_ITERS), MAX_ITERS))
            times, wrong = [], 0
            for i in range(iters):
                times.append(c.timed_call())
                if c.wrong():
                    if wrong == 0:
                        print(f"{args.impl} rank {rank}: {op} bytes={c.bytes} call {i}: wrong result", file=sys.stderr)
                    wrong += 1
            times = sorted(max_over_ranks(times))
            wrong = int(max_over_ranks([wrong])[0])
            p50, p90 = times[len(times) // 2], times[math.ceil(0.9 * len(times)) - 1]
            algbw = c.bytes / p50 / 1e9
            if rank == 0:
                print(f"sweep_row impl={args.impl} n={n} op={op} bytes={c.bytes} count={c.bytes // 4} type=float "
                      f"iters={iters} p50_us={p50 * 1e6:.2f} p90_us={p90 * 1e6:.2f} algbw_GBps={algbw:.3f} "
                      f"busbw_GBps={algbw * c.bus_factor():.3f} wrong={wrong}", flush=True)
            wrong_total += wrong
    if args.wait_probe_ms > 0:
        buf = torch.ones(1024)
        dist.barrier()
        if rank != 0:
            time.sleep(args.wait_probe_ms / 1000)
        cpu0, t0 = time.process_time(), time.perf_counter()
        dist.all_reduce(buf)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        if rank == 0:
            print(f"sweep_wait impl={args.impl} n={n} wait_ms={args.wait_probe_ms} wall_ms={wall * 1e3:.1f} "
                  f"cpu_ms={cpu * 1e3:.1f}", flush=True)
    # Every rank is done with every collective; then each leaves at once. torch 2.6's
    # ProcessGroupGloo destructor can hang joining its worker thread once a peer has gone.
    dist.barrier()
    status[rank] = 0 if wrong_total == 0 else 1
    sys.stdout.flush()
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--impl", default="gloo")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--min-bytes", type=parse_bytes, default=8)
    p.add_argument("--max-bytes", type=parse_bytes, default=8 << 20)
    p.add_argument("--full", action="store_true")
    p.add_argument("--seconds", type=float, default=0.1)
    p.add_argument("--wait-probe-ms", type=int, default=1000)
    p.add_argument("--timeout", type=float, default=500, help="for the whole sweep; then the ranks are killed")
    p.add_argument("--pin", type=parse_cpus, default=None, help="rank r runs on CPU PIN[r %% len(PIN)]")
    args = p.parse_args()
    # Checked here, not in the ranks: one rank failing alone would leave the others waiting.
    allowed = os.sched_getaffinity(0)
    for r in range(args.nproc if args.pin else 0):
        cpu = args.pin[r % len(args.pin)]
        if cpu not in allowed:
            print(f"{args.impl}: --pin: cannot run rank {r} on CPU {cpu} (not one of this host's, or not allowed here)",
                  file=sys.stderr)
            sys.exit(1)
    args.ops = args.ops.split(",")
    if args.full:
        args.max_bytes = 256 << 20
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = multiprocessing.get_context("fork")
    status = ctx.Array("i", [2] * args.nproc)
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=rank_main, args=(r, args, os.path.join(tmp, "store"), status))
                 for r in range(args.nproc)]
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + args.timeout
        for proc in procs:
            proc.join(max(0, deadline - time.monotonic()))
        for proc in procs:
            if proc.is_alive():
                print(f"{args.impl}: rank {procs.index(proc)} still running after {args.timeout} s, killed",
                      file=sys.stderr)
                proc.kill()
                proc.join()
    sys.exit(max(max(status[:]), max(proc.exitcode != 0 for proc in procs)))


if __name__ == "__main__":
    main()
