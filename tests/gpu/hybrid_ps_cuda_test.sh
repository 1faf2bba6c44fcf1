#!/bin/bash
# The parameter-server hybrid with its trainers' DDP Linear on CUDA (the embedding table on the
# server's CPU) against the single-process CPU reference on the same batches: every final
# parameter within 1e-5 relative, as the CPU test requires.
# Usage: hybrid_ps_cuda_test.sh DDPRUN HYBRID_PS HOSTID_WRAPPER
set -uo pipefail
ddprun=$1 trainer=$2 wrapper=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--batches 5 --lr 0.05)
timeout 300 "$ddprun" --standalone --nproc_per_node=4 --max_restarts=0 --term_timeout=5 --no_python "$wrapper" \
  "$trainer" --device cuda --dump "$dir/dist.bin" "${common[@]}" >"$dir/dist.log" 2>&1 ||
  { tail -30 "$dir/dist.log"; echo "FAILED: the CUDA run failed"; exit 1; }
timeout 300 "$trainer" --reference --dump "$dir/ref.bin" "${common[@]}" >"$dir/ref.log" 2>&1 ||
  { tail -30 "$dir/ref.log"; echo "FAILED: the reference failed"; exit 1; }
# The dumps: per tensor, a uint64 element count and that many float32.
python3 - "$dir/dist.bin" "$dir/ref.bin" <<'PY'
import math, struct, sys
def read(path):
    out, data, pos = [], open(path, "rb").read(), 0
    while pos < len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8
        out.append(struct.unpack_from(f"<{n}f", data, pos))
        pos += 4 * n
    return out
got, want = read(sys.argv[1]), read(sys.argv[2])
assert len(got) == len(want) == 3, (len(got), len(want))
for i, (g, w) in enumerate(zip(got, want)):
    diff = math.sqrt(sum((a - b) ** 2 for a, b in zip(g, w)))
    norm = max(math.sqrt(sum(b * b for b in w)), 1e-12)
    print(f"tensor {i}: relative error {diff / norm:.3g}")
    if not diff / norm <= 1e-5:
        sys.exit(f"FAILED: tensor {i} differs from the reference by {diff / norm:.3g} (> 1e-5)")
print("ok: the CUDA hybrid equals its CPU reference")
PY
