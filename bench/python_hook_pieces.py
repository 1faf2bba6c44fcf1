"""Where ddprun's Python hook spends its time in a training step, piece by piece, in one process.
Run it under ddprun (the hook recording: the default), 1 or more ranks:
  PYTHON=/usr/bin/python3 ddprun --standalone --nproc_per_node=2 bench/python_hook_pieces.py \
      [--rounds R] [--block K] [--hidden H] [--depth D] [--batch B]
The job is bench/python_hook_overhead_job.py's (gloo, an MLP in DDP, SGD, a dist.all_reduce of
the loss each step). The hook's cost is a fixed amount of work per step, whatever the model, so a
small model (--hidden 16 --depth 1 --batch 4: a step of a few hundred microseconds) resolves it
best. Each round runs one block of K steps of every variant below, in a rotating order (round r
starts with the r-th), every rank the same schedule, a barrier before each block:
  off          every function the hook wrapped put back to torch's original, and its hook on a
               parameter of the DDP module taken off
  all_reduce   only dist.all_reduce's recording wrapper
  forward      only DDP's forward wrapper (it arms the recording of the next backward(), and
               registers the hook's parameter hook, which then runs in each backward)
  ddp          DDP's forward and torch.autograd.backward's wrappers: the recorded DDP backward()
  ddp_at_call  the same, with the all_reduce's start taken when backward() is called: the hook
               does not find autograd's engine (what finding the computation's end costs)
  all          the hook as it runs: every wrapper
  no_write     every wrapper, the rings' begin and end doing nothing (what the records cost)
Each variant's cost is its block's amount per step less the off block's of the same round:
microseconds of CPU time (the process's, every thread: gloo's too; and the main thread's alone),
of wall time, and voluntary context switches (a hand-off of the interpreter lock between threads
is one); the median over the rounds, with a distribution-free 95% interval of it (order
statistics: a block hit by the machine's other load moves a mean far more than a median).
Pieces are differences of variants in the same round: the backward wrapper = ddp - forward, the
computation's end = ddp - ddp_at_call, the records = all - no_write. Interleaving in one process
is what makes this fair on a loaded machine: both blocks of a pair see the same load.
Rank 0 prints a table (every rank's CPU figure, rank 0's others) and one line for scripts:
  python_hook_pieces ranks=N rounds=R block=K off_cpu_us=C off_wall_us=W
    <variant or piece>=MEDIAN:LO:HI ... (rank 0's CPU us per step)"""
import argparse
import math
import os
import resource
import statistics
import sys
import time
import types

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_hook_overhead_job import IN, OUT, ddp_job, wrapped_functions  # noqa: E402

VARIANTS = ["off", "all_reduce", "forward", "ddp", "ddp_at_call", "all", "no_write"]
# piece: (variant, the variant it is compared with)
PIECES = [("all_reduce", "all_reduce", "off"), ("forward", "forward", "off"), ("backward", "ddp", "forward"),
          ("end_of_computation", "ddp", "ddp_at_call"), ("records", "all", "no_write"), ("all", "all", "off")]


# What each block measures: seconds of CPU of the process (every thread: gloo's too) and of this
# thread (where the hook's Python runs, but for callbacks), seconds of wall time, and the
# process's voluntary context switches (blocking waits), which the machine's other load changes
# far less.
KINDS = ["cpu", "thread_cpu", "wall", "switches"]
SCALE = [1e6, 1e6, 1e6, 1.0]  # us per step; switches per step


def measure():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.process_time(), time.thread_time(), time.perf_counter(), usage.ru_nvcsw


def median_interval(values):
    """(median, low, high): the median of the values and a distribution-free 95% interval of it
    (order statistics, the sign test's): a block hit by the machine's other load moves a mean far
    more than a median."""
    ordered = sorted(values)
    n = len(ordered)
    k = max(0, int((n - 1.96 * math.sqrt(n)) / 2))
    return statistics.median(ordered), ordered[k], ordered[min(n - 1, n - 1 - k)]


class Hook:
    """The hook's pieces, put in place and taken out: its wrappers (as the job finds them) and,
    inside it, the ring writes and the way backward() finds the end of its computation."""

    def __init__(self):
        self.progress = sys.modules.get("_ddprun_progress")
        if self.progress is None:
            sys.exit("python_hook_pieces: ddprun's Python hook is not loaded: run this under ddprun "
                     "with its recording on")
        self.swaps = wrapped_functions()
        kinds = {"all_reduce": 0, "forward": 0, "backward": 0}
        for owner, name, _, _ in self.swaps:
            kind = self.kind(owner, name)
            if kind in kinds:
                kinds[kind] += 1
        if not all(kinds.values()):
            sys.exit(f"python_hook_pieces: the hook's wrappers were not all found: {kinds}")
        self.begin, self.end = self.progress._Ring.begin, self.progress._Ring.end
        self.variable = sys.modules["torch.autograd.variable"]
        self.model = None  # the DDP module, once made

    @staticmethod
    def kind(owner, name):
        if owner is DistributedDataParallel and name == "forward":
            return "forward"
        if owner is torch.autograd and name == "backward":
            return "backward"
        return name

    def use(self, variant):
        on = {"off": (), "all_reduce": ("all_reduce",), "forward": ("forward",), "ddp": ("forward", "backward"),
              "ddp_at_call": ("forward", "backward")}.get(variant)
        for owner, name, wrapper, original in self.swaps:
            wanted = on is None or self.kind(owner, name) in on
            setattr(owner, name, wrapper if wanted else original)
        # The backward's hook on a parameter of the DDP module (where the hook has one): it is
        # registered when a forward arms the module, and taken off where DDP's recording is off,
        # the module's arm with it (the next recorded forward registers both again).
        handle = self.model.__dict__.get("_ddprun_hook") if self.model is not None else None
        if handle is not None and variant in ("off", "all_reduce"):
            handle.remove()
            self.model.__dict__.pop("_ddprun_hook")
            self.model.__dict__.pop("_ddprun_arm", None)
        # A record that writes nothing: the ring's begin and end less their writes to the file.
        self.progress._Ring.begin = (lambda ring, *a: (0, 0, 0, 0)) if variant == "no_write" else self.begin
        self.progress._Ring.end = (lambda ring, rec, ok: None) if variant == "no_write" else self.end
        # The backward wrapper finds autograd's engine through sys.modules to queue the start of
        # the recording at the computation's end; without it, it starts when backward() is
        # called (as where it cannot find the end). torch's own code holds its names already.
        if variant == "ddp_at_call":
            sys.modules["torch.autograd.variable"] = types.ModuleType("no_engine")
            getattr(self.progress, "_queue_callback", []).clear()  # where the hook keeps it found
        else:
            sys.modules["torch.autograd.variable"] = self.variable


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="rounds of blocks, one of each variant (default 40)")
    parser.add_argument("--block", type=int, default=20, help="steps per block (default 20)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first (default 20)")
    parser.add_argument("--hidden", type=int, default=256, help="width of the hidden layers (default 256)")
    parser.add_argument("--depth", type=int, default=3, help="hidden layers (default 3)")
    parser.add_argument("--batch", type=int, default=32, help="samples per rank and step (default 32)")
    args = parser.parse_args()
    for name in ("rounds", "block", "hidden", "depth", "batch"):
        if getattr(args, name) < (2 if name == "rounds" else 1):
            parser.error(f"--{name} {getattr(args, name)}: too small")
    if args.warmup < 0:
        parser.error(f"--warmup {args.warmup}: too small")
    hook = Hook()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    model, step = ddp_job(args.hidden, args.depth, args.batch, rank)
    hook.model = model

    for variant in VARIANTS:  # every variant's paths warm before anything is timed
        hook.use(variant)
        for _ in range(args.warmup):
            step()
    spent = {v: [[] for _ in KINDS] for v in VARIANTS}  # per kind, per round: its amount per step
    for r in range(args.rounds):
        for variant in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
            hook.use(variant)
            dist.barrier()
            before = measure()
            for _ in range(args.block):
                metric = step()
            after = measure()
            for kind, (a, b) in enumerate(zip(after, before)):
                spent[variant][kind].append((a - b) / args.block * SCALE[kind])
    hook.use("all")
    if not torch.isfinite(metric).all():
        sys.exit(f"python_hook_pieces: rank {rank}: the loss is {metric.item()}")
    every = [None] * size
    dist.all_gather_object(every, spent)
    if rank == 0:
        report(args, size, every)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # as the overhead job: torch 1.13's teardown of a DDP module may hang on gloo's threads


def report(args, size, every):
    def cost(spent, kind, variant, base):
        return median_interval([a - b for a, b in zip(spent[variant][kind], spent[base][kind])])

    def fmt(ci, digits=1):
        return f"{ci[0]:+.{digits}f} ({ci[1]:+.{digits}f}..{ci[2]:+.{digits}f})"

    base = {kind: statistics.median(every[0]["off"][k]) for k, kind in enumerate(KINDS)}
    print(f"# python_hook_pieces: {size} rank(s), MLP {IN}-{args.hidden}x{args.depth}-{OUT} batch {args.batch}, "
          f"{args.rounds} rounds of {len(VARIANTS)} blocks of {args.block} steps; off, rank 0 per step (median): "
          f"{base['cpu']:.0f} us CPU, {base['thread_cpu']:.0f} us of it the main thread's, {base['wall']:.0f} us "
          f"wall, {base['switches']:.2f} voluntary context switches; load average {os.getloadavg()[0]:.1f} at the end")
    print("# each figure: the median over the rounds of (variant - base) per step, and its 95% interval")
    head = "".join(f"  {'rank %d CPU us' % r:<24}" for r in range(size))
    print(f"{'piece':<19} {'variant - base':<21}{head}  {'rank 0 thread CPU us':<24}  {'rank 0 wall us':<24}  "
          f"{'rank 0 switches':<22}")
    line = []
    rows = [(v, v, "off") for v in VARIANTS[1:]] + [p for p in PIECES if p[2] != "off"]
    for name, variant, base_variant in rows:
        cpus = "".join(f"  {fmt(cost(spent, 0, variant, base_variant)):<24}" for spent in every)
        rest = "".join(f"  {fmt(cost(every[0], k, variant, base_variant), 2 if k == 3 else 1):<24}" for k in (1, 2, 3))
        print(f"{name:<19} {variant + ' - ' + base_variant:<21}{cpus}{rest}")
        ci = cost(every[0], 0, variant, base_variant)
        line.append(f"{name}={ci[0]:.1f}:{ci[1]:.1f}:{ci[2]:.1f}")
    print(f"python_hook_pieces ranks={size} rounds={args.rounds} block={args.block} off_cpu_us={base['cpu']:.1f} "
          f"off_wall_us={base['wall']:.1f} " + " ".join(line), flush=True)


if __name__ == "__main__":
    main()
