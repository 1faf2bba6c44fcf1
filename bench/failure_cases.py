"""One failing job of three ranks or more, the same under every launcher (bench/failure_compare runs it).
Rank 1 is the culprit in every case; the other ranks only wait in all_reduce #2.
  sleep          rank 1 sleeps an hour before it calls all_reduce #2 (late, not missing)
  skip           rank 1 sleeps instead of calling all_reduce #2
  mismatch_op    rank 1 calls broadcast where the others call all_reduce
  mismatch_size  rank 1 passes 2048 elements where the others pass 1024
  cuda_error     rank 1 indexes a CUDA tensor out of bounds (a device-side assert); nccl only
  sigkill        rank 1 is killed by SIGKILL while the others are in all_reduce #2
--timeout 0 leaves the process group's timeout at torch's default (gloo: 30 minutes; NCCL: 30
minutes in torch 1.13, 10 in torch 2.x), as a job that does not set it has.
Usage: failure_cases.py CASE [--backend nccl|gloo] [--timeout SECONDS]"""
import argparse
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

CASES = ("sleep", "skip", "mismatch_op", "mismatch_size", "cuda_error", "sigkill")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=CASES)
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--timeout", type=float, default=10.0, help="the process group's timeout, seconds; 0: torch's default")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    if args.backend == "nccl":
        if not torch.cuda.is_available():
            sys.exit("failure_cases: --backend nccl needs CUDA, and torch sees no GPU here")
        # Two ranks on one GPU: NCCL refuses them unless each names its own host.
        if torch.cuda.device_count() == 1:
            os.environ.setdefault("NCCL_HOSTID", f"failure-cases-{rank}")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        device = torch.device("cuda")
    elif args.case == "cuda_error":
        sys.exit("failure_cases: cuda_error needs --backend nccl")
    else:
        device = torch.device("cpu")
    if args.timeout > 0:
        dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout))
    else:
        dist.init_process_group(args.backend)
    t = torch.ones(1024, device=device)
    dist.all_reduce(t)  # all_reduce #1: every rank is up
    if device.type == "cuda":
        torch.cuda.synchronize()
    print(f"rank {rank}: all_reduce #1 done", flush=True)
    if rank == 1:
        if args.case == "sleep":
            time.sleep(3600)
            dist.all_reduce(t)
        elif args.case == "skip":
            time.sleep(3600)
        elif args.case == "mismatch_op":
            dist.broadcast(t, 0)
        elif args.case == "mismatch_size":
            dist.all_reduce(torch.ones(2048, device=device))
        elif args.case == "cuda_error":
            index = torch.tensor([1 << 20], device=device)
            t[index] = 0.0
            torch.cuda.synchronize()
        elif args.case == "sigkill":
            time.sleep(1.0)  # rank 0 is inside all_reduce #2 by now
            os.kill(os.getpid(), signal.SIGKILL)
    else:
        dist.all_reduce(t)  # all_reduce #2
    if device.type == "cuda":
        torch.cuda.synchronize()
    print(f"rank {rank}: all_reduce #2 done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
