"""A torch worker for the many-jobs stress test: it claims its job's store for TOKEN (a
worker that reached another job's store, through a port taken twice, sees a foreign token),
then checks a few gloo all_reduces. Appends its pid to PIDFILE so the test can check that
nothing outlives the job."""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

token, pid_file, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(pid_file, "a") as f:
    f.write(f"{os.getpid()}\n")
address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
try:
    # torch 2.x asks for libuv by default; Debian's torch 2.6 is built without it.
    store = dist.TCPStore(address, port, is_master=False, timeout=timedelta(seconds=60), use_libuv=False)
except TypeError:  # torch 1.13 has no use_libuv
    store = dist.TCPStore(address, port, is_master=False, timeout=timedelta(seconds=60))
owner = store.compare_set("isolation/job", "", token).decode()
if owner != token:
    sys.exit(f"the workers' store belongs to job {owner}, not {token}")
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
for step in range(1, steps + 1):
    t = torch.full((1024,), float(rank + step))
    dist.all_reduce(t)
    want = world * (world - 1) / 2 + world * step
    if t[1023].item() != want:
        sys.exit(f"all_reduce #{step} gave {t[1023].item()}, not {want}")
dist.destroy_process_group()
print(f"isolated rank={rank}", flush=True)
