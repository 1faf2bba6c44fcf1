# Sourced by the benchmarks that run torchrun as the peer: torchrun (1.13 and 2.x) makes a
# torchelastic_* directory in TMPDIR for each run and never removes it, so a benchmark points
# TMPDIR at a directory of its own, which goes at exit with everything in it. A benchmark with
# an EXIT trap of its own calls bench_tmpdir_cleanup from it.
bench_tmpdir=$(mktemp -d "${TMPDIR:-/tmp}/ddprun-bench-XXXXXX")
export TMPDIR=$bench_tmpdir
bench_tmpdir_cleanup() { rm -rf "$bench_tmpdir"; }
trap bench_tmpdir_cleanup EXIT
