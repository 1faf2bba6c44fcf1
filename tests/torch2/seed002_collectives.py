# Seed 002, PyTorch's tutorial "Writing Distributed Applications with PyTorch", on torch 2.6
# workers under ddprun: blocking and immediate point-to-point, the tutorial's ring all-reduce,
# all_reduce on a new_group and the six collectives it lists (every ReduceOp), each result
# checked exactly; then a gloo DDP model trained a few steps, its replicas compared bit for bit
# and against a model trained alone on the whole batch. Any world size of 2 or more, on one
# node or several. Prints "rank R/W: seed 002 collectives and DDP ok" and exits 0 when all held.
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
failures = []
# torch 2.6's ProcessGroup destructor joins gloo's threads holding the GIL (pytorch/pytorch#154976
# fixed it later). A gloo thread that drops the last reference to a tensor made in Python needs
# the GIL, so destroy_process_group() hangs if Python has let go of a tensor a finished
# collective still holds. Every tensor given to a collective stays referenced here until then.
kept = []


def keep(tensor):
    kept.append(tensor)
    return tensor


def keep_all(tensors):
    kept.extend(tensors)
    return tensors


def say(line):
    # One write per line: the ranks share ddprun's stdout.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def expect(what, got, want):
    same = torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want
    if not same:
        failures.append(f"{what}: got {got!r}, want {want!r}")
        say(f"rank {rank}: MISMATCH {failures[-1]}")


expect("rank from RANK", rank, int(os.environ["RANK"]))
expect("world size from WORLD_SIZE", world, int(os.environ["WORLD_SIZE"]))
if world < 2:
    sys.exit(f"needs 2 or more ranks, has {world}")
left, right = (rank - 1) % world, (rank + 1) % world

# Blocking point-to-point, as the tutorial's run(): rank 0 sends, every other rank receives.
t = keep(torch.zeros(3))
if rank == 0:
    for dst in range(1, world):
        dist.send(keep(torch.tensor([1.0, 2.0, float(dst)])), dst=dst)
else:
    dist.recv(t, src=0)
    expect("blocking recv from rank 0", t, torch.tensor([1.0, 2.0, float(rank)]))

# Immediate point-to-point around the ring.
out = keep(torch.arange(4, dtype=torch.int64) + 100 * rank)
got = keep(torch.zeros(4, dtype=torch.int64))
requests = [dist.isend(out, dst=right), dist.irecv(got, src=left)]
for req in requests:
    req.wait()
expect("irecv from the left neighbour", got, torch.arange(4, dtype=torch.int64) + 100 * left)


# The tutorial's ring all-reduce, built from isend and recv.
def ring_allreduce(send, recv):
    send_buff, recv_buff, accum = keep_all([send.clone(), send.clone(), send.clone()])
    for i in range(world - 1):
        if i % 2 == 0:
            send_req = dist.isend(send_buff, right)
            dist.recv(recv_buff, left)
            accum[:] += recv_buff[:]
        else:
            send_req = dist.isend(recv_buff, right)
            dist.recv(send_buff, left)
            accum[:] += send_buff[:]
        send_req.wait()
    recv[:] = accum[:]


summed = keep(torch.zeros(5))
ring_allreduce(keep(torch.full((5,), float(rank + 1))), summed)
expect("ring all-reduce", summed, torch.full((5,), float(world * (world + 1) // 2)))

# all_reduce on a group of the first and the last rank (on two nodes it spans both); every rank
# must create the group, only members use it.
members = [0, world - 1]
group = dist.new_group(members)
t = keep(torch.ones(1))
if rank in members:
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    expect("all_reduce on new_group([0, last])", t, torch.tensor([2.0]))

mine = torch.tensor([float(rank + 1)] * 2)
factorial = 1
for k in range(1, world + 1):
    factorial *= k
for op, want in [(dist.ReduceOp.SUM, world * (world + 1) / 2), (dist.ReduceOp.PRODUCT, factorial),
                 (dist.ReduceOp.MAX, world), (dist.ReduceOp.MIN, 1)]:
    t = keep(mine.clone())
    dist.all_reduce(t, op=op)
    expect(f"all_reduce {op}", t, torch.tensor([float(want)] * 2))

src = world - 1
t = keep(torch.arange(6, dtype=torch.float64) + 1000 * rank)
dist.broadcast(t, src=src)
expect("broadcast from the last rank", t, torch.arange(6, dtype=torch.float64) + 1000 * src)

t = keep(torch.tensor([rank, 1], dtype=torch.int64))
dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
if rank == 0:
    expect("reduce to rank 0", t, torch.tensor([world * (world - 1) // 2, world], dtype=torch.int64))

gathered = keep_all([torch.zeros(2, dtype=torch.int32) for _ in range(world)])
dist.all_gather(gathered, keep(torch.tensor([rank, rank * rank], dtype=torch.int32)))
for r in range(world):
    expect(f"all_gather slot {r}", gathered[r], torch.tensor([r, r * r], dtype=torch.int32))

dst = world - 1
t = keep(torch.tensor([rank * 3.0]))
gather_list = keep_all([torch.zeros(1) for _ in range(world)]) if rank == dst else None
dist.gather(t, gather_list=gather_list, dst=dst)
if rank == dst:
    for r in range(world):
        expect(f"gather slot {r}", gather_list[r], torch.tensor([r * 3.0]))

t = keep(torch.zeros(2))
scatter_list = keep_all([torch.tensor([7.0 * r, -1.0]) for r in range(world)]) if rank == 0 else None
dist.scatter(t, scatter_list=scatter_list, src=0)
expect("scatter from rank 0", t, torch.tensor([7.0 * rank, -1.0]))

dist.barrier()

# DDP: every rank trains on its shard of one batch. The replicas must agree bit for bit, and
# with a model trained alone on the whole batch (gradients averaged: equal up to rounding).
torch.manual_seed(0)
reference = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).double()
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).double()
model.load_state_dict(reference.state_dict())
ddp = DDP(model)
generator = torch.Generator().manual_seed(1)
inputs = torch.randn(4 * world, 8, generator=generator, dtype=torch.float64)
targets = torch.randn(4 * world, 1, generator=generator, dtype=torch.float64)
shard = slice(4 * rank, 4 * rank + 4)
initial = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
for step in range(5):
    optimizer.zero_grad()
    nn.functional.mse_loss(ddp(inputs[shard]), targets[shard]).backward()
    optimizer.step()
    reference_optimizer.zero_grad()
    nn.functional.mse_loss(reference(inputs), targets).backward()
    reference_optimizer.step()
flat = keep(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
replicas = keep_all([torch.zeros_like(flat) for _ in range(world)])
dist.all_gather(replicas, flat)
for r in range(world):
    expect(f"DDP replica {r} equals this rank's", replicas[r], flat)
want = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
if not torch.allclose(flat, want, rtol=0, atol=1e-12):
    failures.append(f"DDP model differs from the whole-batch model by {float((flat - want).abs().max())}")
    say(f"rank {rank}: MISMATCH {failures[-1]}")
if torch.equal(flat, initial):
    failures.append("DDP left the parameters as they were")
    say(f"rank {rank}: MISMATCH {failures[-1]}")

del ddp  # its reference to the group too: the group goes (threads joined) while `kept` holds on
dist.destroy_process_group()
node = os.environ.get("GROUP_RANK")
if failures:
    say(f"rank {rank}/{world} (node {node}): {len(failures)} FAILED")
    sys.exit(1)
say(f"rank {rank}/{world} (node {node}): seed 002 collectives and DDP ok")
