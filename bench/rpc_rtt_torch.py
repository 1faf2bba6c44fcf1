"""Peer for bench/rpc_rtt_bench.cc: round-trip time of a small torch.distributed.rpc call
(TensorPipe, CPU) between two workers: "w0" calls add_scalar on "w1" with a 4-element float
tensor and an integer. 200 warm-up calls, then N timed (default 2000); median and p90 in us.
Run: /usr/bin/python3 torchrun_peer.py --standalone --nproc_per_node=2 rpc_rtt_torch.py [calls]"""
import os, sys, time, torch
import torch.distributed.rpc as rpc


def add_scalar(t, x):
    return t + x


def main():
    rank = int(os.environ["RANK"])
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=120)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, rpc_backend_options=opts)
    if rank == 0:
        t = torch.ones(4)
        us = []
        for i in range(200 + calls):
            t0 = time.perf_counter()
            out = rpc.rpc_sync("w1", add_scalar, args=(t, 1))
            t1 = time.perf_counter()
            assert out[0].item() == 2.0
            if i >= 200:
                us.append((t1 - t0) * 1e6)
        us.sort()
        print(f"torch-rpc rtt calls={calls} median_us={us[len(us) // 2]:.1f} p90_us={us[len(us) * 9 // 10]:.1f}",
              flush=True)
    rpc.shutdown()


if __name__ == "__main__":
    main()
