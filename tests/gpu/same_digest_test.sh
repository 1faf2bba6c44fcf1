#!/bin/bash
# Runs a trainer that prints "rank R: ... params fnv1a64=HEX" on 2 ranks under ddprun and passes
# when both ranks ran and printed the same digest (the trainer's ranks start from different
# models, so equal digests show DDP's broadcast and averaging worked).
# Usage: same_digest_test.sh DDPRUN HOSTID_WRAPPER TRAINER [ARGS...]
set -uo pipefail
ddprun=$1 wrapper=$2
shift 2
out=$(timeout 300 "$ddprun" --standalone --nproc_per_node=2 --max_restarts=0 --term_timeout=5 --no_python \
  "$wrapper" "$@" 2>&1)
status=$?
echo "$out" | tail -20
((status == 0)) || { echo "FAILED: ddprun exited $status"; exit 1; }
digests=$(echo "$out" | sed -n 's/.*params fnv1a64=\([0-9a-f]*\).*/\1/p' | sort -u)
count=$(echo "$out" | grep -c "params fnv1a64=")
if ((count != 2)) || [[ $(echo "$digests" | wc -l) -ne 1 ]]; then
  echo "FAILED: expected the same digest from 2 ranks, got $count lines: $digests"
  exit 1
fi
echo "ok: both ranks ended with parameters $digests"
