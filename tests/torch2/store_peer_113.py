# Torch 1.13 (Debian 12's /usr/bin/python3) on the same store as a torch 2.6 client: the
# server speaks both wire generations at once. Reads what torch 2.6 wrote, writes back.
# Exits 0 when every check held.
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

assert torch.__version__.startswith("1.13"), torch.__version__
store = dist.TCPStore(sys.argv[1], int(sys.argv[2]), None, False, timedelta(seconds=30))
checks = {
    "torch 2.6's set": store.get("from-torch2") == b"hello from torch 2.6",
    "torch 2.6's append": store.get("log") == b"one\x00two",
    "torch 2.6's multi_set": store.get("m2") == b"\x00y",
    "torch 2.6's adds": store.add("shared", 10) == 210,
    "torch 2.6's compare_set": store.compare_set("cs", "second", "from 1.13") == b"from 1.13",
    "torch 2.6's sets and delete (16 keys)": store.num_keys() == 16,
}
store.set("from-torch-1.13", "hello from torch 1.13")
for what, ok in checks.items():
    print(f"{'ok' if ok else 'MISMATCH'}: {what}", flush=True)
sys.exit(0 if all(checks.values()) else 1)
