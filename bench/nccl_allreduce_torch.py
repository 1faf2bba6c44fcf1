"""nccl_allreduce_torch: torch.distributed's ProcessGroupNCCL all_reduce in the loop of
bench/nccl_allreduce_bench.cc, line for line (bench/nccl_compare runs both in one run).
Under a launcher that sets torchrun's environment (ddprun or torchrun), one rank per process:
  python3 nccl_allreduce_torch.py [--max-bytes B] [--seconds S]
Rank 0 prints per size: nccl_row impl=torch n=N bytes=B iters=K us=T busbw_GBps=X
Exit status 1 on a wrong result."""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--seconds", type=float, default=0.6)
    args = p.parse_args()
    device = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    expected = n * (n + 1) / 2.0

    def slowest(value):
        t = torch.full((1,), value, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    nbytes = 8
    while nbytes <= args.max_bytes:
        count = nbytes // 4
        x = torch.empty(count, dtype=torch.float32, device=device)

        def one_round(iters):
            x.fill_(rank + 1)
            torch.cuda.current_stream().synchronize()
            start = time.perf_counter()
            for i in range(iters):
                dist.all_reduce(x)
                if i + 1 < iters:
                    x.fill_(rank + 1)
            torch.cuda.current_stream().synchronize()
            us = (time.perf_counter() - start) * 1e6 / iters
            if x[0].item() != expected or x[count - 1].item() != expected:
                print(f"all_reduce at {nbytes} bytes: wrong result", file=sys.stderr)
                sys.exit(1)
            return slowest(us)

        for _ in range(5):
            one_round(1)
        probe = one_round(10)
        iters = int(min(max(args.seconds / 3 * 1e6 / probe, 10), 5000))
        us = statistics.median([one_round(iters) for _ in range(3)])
        if rank == 0:
            busbw = nbytes * 2.0 * (n - 1) / n / us / 1e3 if n > 1 else nbytes / us / 1e3
            print(f"nccl_row impl=torch n={n} bytes={nbytes} iters={iters} us={us:.2f} busbw_GBps={busbw:.2f}",
                  flush=True)
        nbytes *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
