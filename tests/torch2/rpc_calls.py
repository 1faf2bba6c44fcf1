# torch.distributed.rpc (TensorPipe) on torch 2.6 workers under ddprun: init_rpc meets through
# the workers' store with the env:// rendezvous, then every rank calls its right neighbour with
# rpc_sync, rpc_async and remote (a built-in and a function of this script), and passes an
# RRef it owns for the neighbour to fetch. Results are checked exactly. Any world size of 2 or
# more. Prints "rank R/W (node G): rpc ok" and exits 0 when all held.
import os
import sys

import torch
import torch.distributed.rpc as rpc


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def scaled_sum(t, factor):
    return (t * factor).sum().item(), int(os.environ["RANK"])


def fetch(rref):
    return rref.to_here() + 1


rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
options = rpc.TensorPipeRpcBackendOptions(init_method="env://", rpc_timeout=60)
rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world, rpc_backend_options=options)
right = (rank + 1) % world
callee = f"worker{right}"
failures = []


def expect(what, got, want):
    same = torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want
    if not same:
        failures.append(f"{what}: got {got!r}, want {want!r}")
        say(f"rank {rank}: MISMATCH {failures[-1]}")


expect("the callee's name", rpc.get_worker_info(callee).id, right)
x = torch.arange(4, dtype=torch.float32) + rank
expect("rpc_sync torch.add", rpc.rpc_sync(callee, torch.add, args=(x, 10)), x + 10)
expect("rpc_sync of this script's function", rpc.rpc_sync(callee, scaled_sum, args=(x, 2)),
       (float((x * 2).sum()), right))
futures = [rpc.rpc_async(callee, torch.mul, args=(x, k)) for k in range(3)]
for k, fut in enumerate(futures):
    expect(f"rpc_async torch.mul {k}", fut.wait(), x * k)
remote = rpc.remote(callee, torch.add, args=(torch.ones(2, 3), x[0]))
expect("remote's owner", remote.owner().id, right)
expect("remote torch.add to_here", remote.to_here(), torch.ones(2, 3) + x[0])
owned = rpc.RRef(torch.full((2,), float(rank)))
expect("an RRef owned here, fetched by the callee", rpc.rpc_sync(callee, fetch, args=(owned,)),
       torch.full((2,), float(rank + 1)))
rpc.shutdown()
if failures:
    sys.exit(1)
say(f"rank {rank}/{world} (node {os.environ['GROUP_RANK']}): rpc ok")
