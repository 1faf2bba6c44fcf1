"""The job that bench/python_hook_overhead times under ddprun, with ddprun's Python hook
recording (the default) and with DDPRUN_FLIGHT_RECORDER=0; also run under torchrun as the peer.
A training loop on gloo: an MLP (IN-HIDDEN-...-10, DEPTH hidden layers) in
DistributedDataParallel, SGD, a fixed random batch per rank, and every step an explicit
dist.all_reduce of the loss as a metric, so that both recorded paths (DDP's gradient
all-reduce, recorded at each backward(), and a plain torch.distributed call) run each step. After WARMUP steps, STEPS steps are timed between two barriers. Then CALLS
dist.all_reduce of one float on a group of the rank alone (U), and as many of the function
ddprun's wrapper calls (W; the same function when nothing is recorded): U - W is the recording
wrapper's cost per call.
Then, with --ab_blocks N, the in-process A/B: 2N blocks of --ab_steps steps, taking turns with
every function ddprun's hook wrapped put in place ("on") and its original back ("off"), in this
one process, so that each on block is compared with the off block beside it, free of the
run-to-run noise of separate processes (A = the median of the pairs' CPU time ratios, B of their
wall time ratios; where nothing is wrapped both blocks run the same code, and A and B show the
figure's noise).
Rank 0 prints one line:
  python_hook_overhead_job ranks=N steps=S seconds=T steps_per_s=R cpu_us_per_step=P calls=C us_per_call=U
    us_per_call_unwrapped=W recorded=0|1 ddp_recorded=0|1 [ab_blocks=N ab_wrapped=F ab_cpu_ratio=A ab_step_ratio=B
    ab_cpu_pairs=R1,R2,... ab_wall_pairs=R1,R2,... (every pair's on/off ratio, in order)]
(P: rank 0's CPU time, all its threads, per timed step; recorded: dist.all_reduce is ddprun's recording wrapper; ddp_recorded: DDP's forward is
ddprun's, which arms the recording of the backward() after it.)
Usage: python_hook_overhead_job.py [--steps S] [--warmup W] [--calls C] [--hidden H] [--depth D]
                                   [--batch B] [--ab_blocks N] [--ab_steps K]"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

IN, OUT = 256, 10


def wrapped_functions():
    """(owner, name, wrapper, original) of every function ddprun's hook put in place of torch's:
    the recorded torch.distributed calls (in both modules that hold them), DDP's forward and
    torch.autograd.backward. Empty without the hook."""
    import torch.distributed.distributed_c10d as c10d
    found = []
    for owner in (dist, c10d, torch.autograd, DistributedDataParallel):
        for name, fn in list(vars(owner).items()):
            if getattr(fn, "__ddprun_recorded__", False) and hasattr(fn, "__wrapped__"):
                found.append((owner, name, fn, fn.__wrapped__))
    return found


def in_process_ab(step, model, blocks, steps):
    """' ab_blocks=N ab_wrapped=F ab_cpu_ratio=A ab_step_ratio=B': blocks of steps taking turns with
    the hook's functions in place and with torch's originals back (every rank the same schedule,
    so that both ranks run the same code in each block)."""
    swaps = wrapped_functions()

    def use(on):
        for owner, name, wrapper, original in swaps:
            setattr(owner, name, wrapper if on else original)
        # The hook's own hook on a parameter of the DDP module, registered by its forward
        # wrapper when it arms the module: off with the wrappers (its arm with it, so that the
        # next recorded forward registers both again), or the off blocks would pay for it.
        handle = model.__dict__.pop("_ddprun_hook", None) if not on else None
        if handle is not None:
            handle.remove()
            model.__dict__.pop("_ddprun_arm", None)

    cpu_ratios, wall_ratios = [], []
    for pair in range(blocks):
        spent = {}
        for on in ((True, False) if pair % 2 == 0 else (False, True)):  # each first every other pair
            use(on)
            dist.barrier()
            start, cpu_start = time.perf_counter(), time.process_time()
            for _ in range(steps):
                step()
            spent[on] = (time.perf_counter() - start, time.process_time() - cpu_start)
        use(True)
        wall_ratios.append(spent[True][0] / spent[False][0])
        cpu_ratios.append(spent[True][1] / max(spent[False][1], 1e-9))
    dist.barrier()
    # Every pair's ratios too: the bench pools them over its runs, whose median alone cannot say
    # how sure a 1% figure is.
    return (f" ab_blocks={blocks} ab_wrapped={len(swaps)} ab_cpu_ratio={statistics.median(cpu_ratios):.4f} "
            f"ab_step_ratio={statistics.median(wall_ratios):.4f} "
            f"ab_cpu_pairs={','.join(f'{r:.5f}' for r in cpu_ratios)} "
            f"ab_wall_pairs={','.join(f'{r:.5f}' for r in wall_ratios)}")


def ddp_job(hidden, depth, batch, rank):
    """(DDP model, step): the MLP (IN-HIDDEN-...-10, DEPTH hidden layers) in DDP with SGD, a fixed
    random batch of this rank, and a step that trains once and all-reduces the loss as a metric,
    so that both recorded paths (DDP's gradient all-reduce, a plain torch.distributed call) run
    each step. The process group must be up. bench/python_hook_pieces.py times the same job."""
    torch.manual_seed(0)  # the same initial weights on every rank, as DDP expects
    layers, width = [], IN
    for _ in range(depth):
        layers += [torch.nn.Linear(width, hidden), torch.nn.ReLU()]
        width = hidden
    layers.append(torch.nn.Linear(width, OUT))
    model = DistributedDataParallel(torch.nn.Sequential(*layers))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(batch, IN, generator=generator)
    y = torch.randint(0, OUT, (batch,), generator=generator)

    def step():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        metric = loss.detach().clone()
        dist.all_reduce(metric)  # the metric every step: a plain recorded call
        return metric

    return model, step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    parser.add_argument("--calls", type=int, default=2000, help="timed all_reduce calls of one float")
    parser.add_argument("--hidden", type=int, default=256, help="width of the hidden layers")
    parser.add_argument("--depth", type=int, default=3, help="hidden layers")
    parser.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--ab_blocks", type=int, default=0, help="in-process A/B pairs of blocks (0: none)")
    parser.add_argument("--ab_steps", type=int, default=50, help="steps per A/B block")
    args = parser.parse_args()
    for name in ("steps", "warmup", "calls", "hidden", "depth", "batch", "ab_blocks", "ab_steps"):
        if getattr(args, name) < (0 if name in ("warmup", "ab_blocks") else 1):
            parser.error(f"--{name} {getattr(args, name)}: too small")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # torch's default timeout, as a job that sets none
    rank, size = dist.get_rank(), dist.get_world_size()
    model, step = ddp_job(args.hidden, args.depth, args.batch, rank)

    for _ in range(args.warmup):
        step()
    dist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(args.steps):
        metric = step()
    dist.barrier()
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu_start  # every thread of this process: gloo's too
    if not torch.isfinite(metric).all():
        raise SystemExit(f"python_hook_overhead_job: rank {rank}: the loss is {metric.item()}")
    ab = in_process_ab(step, model, args.ab_blocks, args.ab_steps) if args.ab_blocks else ""

    # The micro figure: CALLS calls of dist.all_reduce, and as many of the function it wraps
    # (functools.wraps keeps it as __wrapped__; without the hook, the same function), in blocks
    # of 100 taking turns in this one process, so that the difference is the wrapper's alone
    # and not one run's luck against another's. Where nothing is recorded both are the same
    # function, and their difference shows the figure's noise.
    # The calls go to a group of this rank alone (every rank makes every group, as torch
    # requires): the same recorded path, without the other rank's timing in the figure, which
    # on a loaded machine varies by more than the wrapper costs.
    alone = [dist.new_group([r]) for r in range(size)][rank]
    one = torch.ones(1)
    plain = getattr(dist.all_reduce, "__wrapped__", dist.all_reduce)
    for _ in range(min(args.calls, 100)):
        dist.all_reduce(one, group=alone)
    spent = {"recorded": 0.0, "plain": 0.0}
    left, turns = args.calls, [("recorded", dist.all_reduce), ("plain", plain)]
    while left:
        block = min(left, 100)
        left -= block
        turns.reverse()  # each goes first every other block: no order favours either
        for name, fn in turns:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(block):
                fn(one, group=alone)
            spent[name] += time.perf_counter() - start
    dist.barrier()
    per_call = spent["recorded"] / args.calls
    per_plain = spent["plain"] / args.calls
    recorded = int(getattr(dist.all_reduce, "__ddprun_recorded__", False))
    hooked = int(getattr(type(model).forward, "__ddprun_recorded__", False))
    if rank == 0:
        print(f"python_hook_overhead_job ranks={size} steps={args.steps} seconds={seconds:.4f} "
              f"steps_per_s={args.steps / seconds:.2f} cpu_us_per_step={cpu / args.steps * 1e6:.1f} calls={args.calls} us_per_call={per_call * 1e6:.2f} "
              f"us_per_call_unwrapped={per_plain * 1e6:.2f} "
              f"recorded={recorded} ddp_recorded={hooked}{ab}", flush=True)
    dist.destroy_process_group()
    # Out now, without the interpreter's teardown: in torch 1.13, freeing the DDP module frees its
    # Reducer, whose ProcessGroupGloo joins its worker threads while holding the GIL, and a worker
    # freeing a finished work's tensor waits for the GIL: one run in a few never exits (seen here
    # with ddprun's recording off, so not the hook's doing). The figures are out; nothing is left.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
