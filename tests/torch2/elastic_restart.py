# torch.distributed.elastic's worker contract as torch 2.6 scripts read it, across restarts:
# each attempt joins a gloo group through env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
# TORCHELASTIC_USE_AGENT_STORE), checks torch's own readings (is_torchelastic_launched,
# get_node_local_rank) and what every rank sees (one run id, one restart count, one master,
# ROLE_RANK, GROUP_RANK, LOCAL_WORLD_SIZE), and that the workers' store is a fresh one: torch
# 2.x no longer prefixes its keys per attempt, so keys of the last attempt must be gone. Rank
# 1 fails (through @record, with a message of two lines) until TORCHELASTIC_RESTART_COUNT
# reaches --succeed-at.
# Rank 0 prints "attempt R: run_id=... restart=R master=HOST:PORT ok" per attempt.
import argparse
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@record
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--succeed-at", type=int, required=True)
    args = parser.parse_args()
    env = os.environ
    restart = int(env["TORCHELASTIC_RESTART_COUNT"])
    failures = []

    def expect(what, got, want):
        if got != want:
            failures.append(f"{what}: got {got!r}, want {want!r}")

    expect("dist.is_torchelastic_launched()", dist.is_torchelastic_launched(), True)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    expect("get_rank() and RANK", rank, int(env["RANK"]))
    expect("get_world_size() and WORLD_SIZE", world, int(env["WORLD_SIZE"]))
    expect("get_node_local_rank() and LOCAL_RANK", dist.get_node_local_rank(), int(env["LOCAL_RANK"]))

    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), None, False, timedelta(seconds=30),
                          use_libuv=False)
    expect("a key of the last attempt in this attempt's store", store.check([f"attempt-{restart - 1}/{rank}"]), False)
    store.set(f"attempt-{restart}/{rank}", "here")

    # What every rank sees, through the workers' store (json), and a collective on top: a tensor
    # the script keeps until the group is gone (torch 2.6's ProcessGroup destructor holds the GIL
    # while a gloo thread may need it to free a tensor Python let go of: pytorch/pytorch#154976).
    mine = {k: env.get(k) for k in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT",
                                    "GROUP_RANK", "ROLE_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK")}
    store.set(f"env/{rank}", json.dumps(mine))
    everyone = [json.loads(v) for v in store.multi_get([f"env/{r}" for r in range(world)])]
    for r, seen in enumerate(everyone):
        for key in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT"):
            expect(f"rank {r}'s {key}", seen[key], mine[key])
        expect(f"rank {r}'s RANK", seen["RANK"], str(r))
        expect(f"rank {r}'s ROLE_RANK (one role)", seen["ROLE_RANK"], str(r))
        expect(f"rank {r}'s GROUP_RANK (one node)", seen["GROUP_RANK"], "0")
        expect(f"rank {r}'s LOCAL_RANK (one node)", seen["LOCAL_RANK"], str(r))
        expect(f"rank {r}'s LOCAL_WORLD_SIZE", seen["LOCAL_WORLD_SIZE"], str(world))
    ones = torch.ones(3)
    dist.all_reduce(ones)
    expect("all_reduce of ones", ones.tolist(), [float(world)] * 3)
    dist.barrier()
    dist.destroy_process_group()
    if failures:
        for f in failures:
            say(f"rank {rank}: MISMATCH {f}")
        sys.exit(1)
    if rank == 0:
        say(f"attempt {restart}: run_id={mine['TORCHELASTIC_RUN_ID']} restart={restart} "
            f"master={mine['MASTER_ADDR']}:{mine['MASTER_PORT']} ok")
    if rank == 1 and restart < args.succeed_at:
        # Several lines and non-ASCII, as torch 2.x's own messages can be; json.dump escapes them.
        raise RuntimeError(f"planned failure at restart {restart}: loss is nan (learning rate \u03b7=0.5)\n"
                           "last good step: 3")


main()
