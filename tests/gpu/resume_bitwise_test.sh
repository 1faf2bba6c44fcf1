#!/bin/bash
# Elastic resume on the GPU: the Fashion-MNIST trainer on CUDA with deterministic algorithms,
# 2 ranks on this host, run once uninterrupted and once with rank 1 dying before step 40 (ddprun
# restarts the group, which resumes from the step-30 checkpoint): the final parameters of both
# runs must be equal byte for byte (model, momentum, data order, schedule and each rank's CPU and
# CUDA generators all continued exactly).
# Usage: resume_bitwise_test.sh DDPRUN FASHION_MNIST HOSTID_WRAPPER
set -uo pipefail
ddprun=$1 trainer=$2 wrapper=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
run() {  # run NAME [env...]
  local name=$1
  shift
  env "$@" timeout 500 "$ddprun" --standalone --nproc_per_node=2 --max_restarts=1 --term_timeout=5 --no_python \
    "$wrapper" "$trainer" --device cuda --deterministic --train-limit 2048 --test-limit 500 --epochs 2 \
    --checkpoint-dir "$dir/$name/ckpt" --checkpoint-every 15 --dump-params "$dir/$name/params" \
    >"$dir/$name.log" 2>&1
}
run clean || { tail -30 "$dir/clean.log"; echo "FAILED: the uninterrupted run failed"; exit 1; }
run crashed DDPRUN_CRASH_AT_STEP=40 DDPRUN_CRASH_RANK=1 ||
  { tail -30 "$dir/crashed.log"; echo "FAILED: the run with a crash failed"; exit 1; }
grep -q "training on cuda" "$dir/clean.log" || { echo "FAILED: the trainer did not say it trains on cuda"; exit 1; }
grep -q "resumed at step 30 " "$dir/crashed.log" || { tail -30 "$dir/crashed.log"; echo "FAILED: no resume at step 30"; exit 1; }
for r in 0 1; do
  if ! cmp "$dir/clean/params/params_rank$r.bin" "$dir/crashed/params/params_rank$r.bin"; then
    echo "FAILED: rank $r's final parameters differ from the uninterrupted run's"
    exit 1
  fi
done
cmp -s "$dir/clean/params/params_rank0.bin" "$dir/clean/params/params_rank1.bin" ||
  { echo "FAILED: the ranks of the uninterrupted run ended with different parameters"; exit 1; }
echo "ok: resumed at step 30 on cuda, final parameters bitwise equal to the uninterrupted run"
