"""The seed's elastic_ddp.py: a ToyModel trained with DistributedDataParallel on CPU (gloo),
started by a launcher (ddprun or torchrun) that sets RANK, WORLD_SIZE, MASTER_ADDR, ...

    ddprun --standalone --nproc_per_node=2 trainers/elastic_ddp.py --steps 50

Rank 0 prints the loss as it falls; at the end every rank checks that its parameters equal
rank 0's (DDP keeps replicas in sync) and that the loss went down."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


@record
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}/{world}: started (local rank {os.environ['LOCAL_RANK']}, "
          f"restart {os.environ['TORCHELASTIC_RESTART_COUNT']})", flush=True)

    torch.manual_seed(0)  # same initial model everywhere; DDP broadcasts rank 0's anyway
    model = DDP(ToyModel())
    optimizer = optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()
    generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own data shard
    inputs = torch.randn(64, 10, generator=generator)
    targets = inputs[:, :5] * 2.0 - inputs[:, 5:]  # a learnable target

    first_loss = last_loss = None
    for step in range(args.steps):
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        last_loss = loss.item()
        if first_loss is None:
            first_loss = last_loss
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {last_loss:.4f}", flush=True)

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    if not torch.equal(flat, reference):
        raise RuntimeError(f"rank {rank}: parameters differ from rank 0 after training")
    if not last_loss < first_loss:
        raise RuntimeError(f"rank {rank}: loss did not fall ({first_loss:.4f} -> {last_loss:.4f})")
    dist.barrier()
    print(f"rank {rank}: done, loss {first_loss:.4f} -> {last_loss:.4f}, replicas in sync", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
