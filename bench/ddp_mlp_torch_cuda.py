"""ddp_mlp_torch_cuda: PyTorch DDP (NCCL) in the loop of bench/ddp_mlp.cc --device cuda, line for
line: the MLP 784-W-W-10 on cuda:(LOCAL_RANK modulo the visible devices) with device_ids, SGD
lr 0.01 momentum 0.9, cross-entropy on seeded synthetic batches drawn on the CPU, each step
timed between two synchronizations of the current stream, median after 5 warm-up steps.
Under a launcher with torchrun's environment (bench/ddp_cuda_compare runs it under ddprun):
  python3 ddp_mlp_torch_cuda.py [steps] [--width W] [--batch B] [--per-rank-hostid]
Rank 0 prints: torch-ddp n=N steps=S median_step_s=.. samples_per_s=.. final_loss=.. device=cuda
  width=W batch=B fr_buffer=<torch's flight-recorder entries, from its environment>"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    p = argparse.ArgumentParser()
    p.add_argument("steps", type=int, nargs="?", default=50)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--per-rank-hostid", action="store_true",
                   help="an NCCL_HOSTID of this rank's own, so that ranks may share one GPU (as "
                        "tests/gpu/per_rank_hostid.sh does for a program that is not Python)")
    args = p.parse_args()
    if args.per_rank_hostid:
        # Read by NCCL when the first communicator is made, after this.
        os.environ["NCCL_HOSTID"] = "ddprun-test-rank-" + os.environ.get("LOCAL_RANK", "0")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(784, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, args.width),
                              torch.nn.ReLU(), torch.nn.Linear(args.width, 10)).to(device)
    model = DistributedDataParallel(net, device_ids=[device.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)
    times = []
    for _ in range(args.steps):
        x = torch.randn(args.batch, 784, generator=gen).to(device)
        y = torch.randint(0, 10, (args.batch,), generator=gen).to(device)
        torch.cuda.current_stream().synchronize()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        torch.cuda.current_stream().synchronize()
        times.append(time.perf_counter() - t0)
    median = statistics.median_low(sorted(times[5:]))
    # torch's flight recorder as this process ran it (TORCH_FR_BUFFER_SIZE first, as torch 2.7+
    # reads it): bench/torch_fr_compare checks it.
    fr_buffer = os.environ.get("TORCH_FR_BUFFER_SIZE", os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "unset"))
    if rank == 0:
        print(f"torch-ddp n={world} steps={args.steps} median_step_s={median:.5f} "
              f"samples_per_s={args.batch * world / median:.1f} final_loss={loss.item():.4f} device=cuda "
              f"width={args.width} batch={args.batch} fr_buffer={fr_buffer}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
