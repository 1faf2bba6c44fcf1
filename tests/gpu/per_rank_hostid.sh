#!/bin/sh
# Runs a worker with an NCCL_HOSTID of its own rank: NCCL refuses two ranks on one GPU
# ("Duplicate GPU detected") unless they claim different hosts, and then connects them through
# its socket transport. That is how the GPU tests run world sizes 2 and 3 on one GPU.
# Usage (as ddprun's program): per_rank_hostid.sh PROGRAM [ARGS...]
NCCL_HOSTID="ddprun-test-rank-${LOCAL_RANK:?per_rank_hostid.sh runs under ddprun (LOCAL_RANK)}"
export NCCL_HOSTID
exec "$@"
