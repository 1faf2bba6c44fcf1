#!/usr/bin/env bash
# ddprun under a real SLURM: Debian's slurm-wlm and munge run here as a two-node cluster
# (one slurmctld, two slurmd started with -N n1 / -N n2, all in a temporary directory; the
# node names resolve to 127.0.0.1 through a private /etc/hosts in a mount namespace of this
# test's own). The daemons listen on fixed ports (slurmctld 6817, slurmd n1 6818, n2 6819):
# nothing is picked, so the test runs in a network namespace of its own
# (scripts/in-private-netns), where no one else holds them.
#   ranks:   srun -N2 --ntasks-per-node=1 ddprun-slurm --nproc_per_node=2 runs 4 ranks,
#            RANK/GROUP_RANK/LOCAL_RANK/WORLD_SIZE as SLURM numbers the nodes; --dry_run
#            under srun prints each node's flags
#   restart: a worker that fails on the first attempt is restarted by ddprun; the job
#            then succeeds on both nodes
#   scancel: a job submitted with scripts/ddprun.sbatch (ddprun-slurm starts the srun
#            step and takes --nproc_per_node from --ntasks-per-node) is cancelled; no
#            process of it is left
#   ddp:     scripts/ddprun.sbatch trains trainers/elastic_ddp.py (PyTorch DDP, gloo) on
#            2 nodes x 2 workers; every replica ends in sync
# Exit 77 (ctest: skipped) with a message where SLURM cannot be installed (or
# DDPRUN_SLURM_INSTALL=0 forbids it), no network namespace can be made, or its daemons
# cannot start. Takes about 30 s.
# Usage: tests/e2e/slurm_cluster_test.sh [-h] BIN_DIR [SCENARIO...]
set -euo pipefail
if [[ "${1:-}" == "-h" || $# -lt 1 ]]; then
  sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
bin=$(cd "$1" && pwd)
shift
scenarios=(ranks restart scancel ddp)
[[ $# -gt 0 ]] && scenarios=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
wrapper="$source_dir/scripts/ddprun-slurm"

skip() {
  echo "SKIP: $*"
  exit 77
}

# Re-run inside a network namespace of its own (for the daemons' fixed ports) and, where it
# can be made, a private mount namespace, where n1 and n2 can be given to 127.0.0.1 without
# touching the machine's /etc/hosts.
if [[ -z "${DDPRUN_SLURM_TEST_INNER:-}" ]]; then
  [[ $(id -u) -eq 0 ]] || skip "the SLURM test starts slurmctld/slurmd/munged as root"
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null ||
    ! command -v srun >/dev/null; then
    [[ "${DDPRUN_SLURM_INSTALL:-1}" != 0 ]] || skip "slurm-wlm and munge are not installed (DDPRUN_SLURM_INSTALL=0)"
    "$source_dir/scripts/setup-slurm" || skip "slurm-wlm and munge are not installed and could not be installed"
  fi
  netns=("$source_dir/scripts/in-private-netns" "$0" "$bin" "${scenarios[@]}")
  if unshare --mount --propagation private true 2>/dev/null; then
    DDPRUN_SLURM_TEST_INNER=ns exec unshare --mount --propagation private "${netns[@]}"
  fi
  DDPRUN_SLURM_TEST_INNER=plain exec "${netns[@]}"
fi
[[ -z "${DDPRUN_PRIVATE_NETNS_UNAVAILABLE:-}" ]] ||
  skip "$DDPRUN_PRIVATE_NETNS_UNAVAILABLE (the SLURM daemons take fixed ports)"
[[ "${DDPRUN_PRIVATE_NETNS:-}" == "$(readlink /proc/self/ns/net)" ]] ||
  skip "not in a network namespace of its own (the SLURM daemons take fixed ports: run it without DDPRUN_SLURM_TEST_INNER)"

work=$(mktemp -d /tmp/ddprun-slurm-test.XXXXXX)
chmod 755 "$work"
tag="ddprun-slurm-test-$$"
# Every process of the test's jobs carries this in its environment (srun and sbatch pass
# the caller's environment on), the daemons do not: that is how leftovers are found.
job_tag="DDPRUN_SLURM_TEST_JOB=$tag"
daemon_pids=()

# Pids of processes whose environment holds $1 ("NAME=value").
pids_with_env() {
  local pid
  for environ in /proc/[0-9]*/environ; do
    pid=${environ#/proc/}
    pid=${pid%/environ}
    [[ $pid == "$$" ]] && continue
    if { tr "\\0" "\\n" <"$environ"; } 2>/dev/null | grep -qxF "$1"; then echo "$pid"; fi
  done
}

cleanup() {
  set +e
  if [[ -n "${SLURM_CONF:-}" ]] && command -v scancel >/dev/null; then
    timeout 10 scancel --user=root >/dev/null 2>&1
  fi
  for pid in "${daemon_pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 50); do
    alive=0
    for pid in "${daemon_pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "${daemon_pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  # slurmstepd and anything a job left behind.
  for pid in $(pids_with_env "$job_tag") $(pids_with_env "DDPRUN_SLURM_TEST_DAEMON=$tag"); do
    kill -KILL "$pid" 2>/dev/null
  done
  if [[ -n "${DDPRUN_SLURM_TEST_KEEP:-}" ]]; then
    echo "kept $work (DDPRUN_SLURM_TEST_KEEP)"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT

extra_flags=()
if [[ "$DDPRUN_SLURM_TEST_INNER" == ns ]] &&
  { cat /etc/hosts; echo "127.0.0.1 n1 n2"; } >"$work/hosts" && mount --bind "$work/hosts" /etc/hosts 2>/dev/null; then
  :
else
  # Without a private /etc/hosts, n1 does not resolve: name the rendezvous host.
  echo "note: no private /etc/hosts (mount namespace unavailable); passing --master_addr=127.0.0.1"
  extra_flags=(--master_addr=127.0.0.1)
fi

# SLURM's own ports, and the next for the second node: free in this test's network namespace.
ctl_port=6817
n1_port=6818
n2_port=6819

mkdir -p "$work/munge" "$work/state" "$work/spool" "$work/log" "$work/out"
chmod 700 "$work/munge"
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chmod 600 "$work/munge/munge.key"
host=$(hostname -s)
cat >"$work/slurm.conf" <<EOF
ClusterName=ddprun-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$work/munge/sock
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool/%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd-%n.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
MinJobAge=2
InactiveLimit=0
SlurmdTimeout=60
NodeName=n[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$n1_port,$n2_port CPUs=2 State=UNKNOWN
PartitionName=test Nodes=n[1-2] Default=YES MaxTime=10 State=UP
EOF
export SLURM_CONF="$work/slurm.conf"

daemon_env=(env "DDPRUN_SLURM_TEST_DAEMON=$tag")
"${daemon_env[@]}" munged -F -f --socket="$work/munge/sock" --key-file="$work/munge/munge.key" \
  --log-file="$work/log/munged.log" --pid-file="$work/munge/pid" --seed-file="$work/munge/seed" \
  >"$work/log/munged.out" 2>&1 &
daemon_pids+=($!)
for _ in $(seq 50); do [[ -S "$work/munge/sock" ]] && break; sleep 0.1; done
[[ -S "$work/munge/sock" ]] || { tail -5 "$work/log/munged.log" 2>/dev/null; skip "munged did not start"; }
"${daemon_env[@]}" slurmctld -D -i -f "$SLURM_CONF" >"$work/log/slurmctld.out" 2>&1 &
daemon_pids+=($!)
for node in n1 n2; do
  "${daemon_env[@]}" slurmd -D -N "$node" -f "$SLURM_CONF" >"$work/log/slurmd-$node.out" 2>&1 &
  daemon_pids+=($!)
done
ready=0
for _ in $(seq 300); do
  if [[ $(sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$') -eq 2 ]]; then
    ready=1
    break
  fi
  dead=0
  for pid in "${daemon_pids[@]}"; do kill -0 "$pid" 2>/dev/null || dead=1; done
  ((!dead)) || break # a daemon exited: it will not come up by waiting
  sleep 0.1
done
if ((!ready)); then
  # (|| true: under pipefail, sinfo cut off by head must not end the script before the skip.)
  sinfo -N 2>&1 | head -5 || true
  tail -n 5 "$work"/log/*.log "$work"/log/*.out 2>/dev/null || true
  skip "the SLURM daemons did not start (both nodes idle within 30 s, every daemon running)"
fi
echo "cluster up: slurmctld on $ctl_port, slurmd n1 on $n1_port, n2 on $n2_port"
export DDPRUN="$bin/ddprun"
export PYTHON=/usr/bin/python3

failures=0
fail() {
  echo "FAIL [$scenario]: $*"
  failures=$((failures + 1))
}

# A job step of this test, its output in $work/out/$1; bounded in time.
run_step() {
  local name=$1
  shift
  env "$job_tag" timeout -k 5 120 srun --time=3 "$@" >"$work/out/$name" 2>&1
}

scenario_ranks() {
  local out="$work/out/ranks"
  if ! run_step ranks -N2 --ntasks-per-node=1 "$wrapper" --nproc_per_node=2 "${extra_flags[@]}" \
    --no_python "$bin/ddprun_test_worker" env; then
    fail "the job failed"
    cat "$out"
    return
  fi
  local job_id
  job_id=$(grep -o 'TORCHELASTIC_RUN_ID=[0-9]*' "$out" | head -1 | cut -d= -f2)
  [[ -n "$job_id" ]] || fail "no TORCHELASTIC_RUN_ID (the SLURM job id) in the output"
  for rank in 0 1 2 3; do
    local group=$((rank / 2)) local_rank=$((rank % 2))
    for want in "RANK=$rank" "GROUP_RANK=$group" "LOCAL_RANK=$local_rank" "WORLD_SIZE=4" "GROUP_WORLD_SIZE=2" \
      "LOCAL_WORLD_SIZE=2" "TORCHELASTIC_RUN_ID=$job_id"; do
      [[ $(grep -cxF "R$rank $want" "$out") -eq 1 ]] || fail "rank $rank: expected exactly one 'R$rank $want'"
    done
  done
  [[ $(grep -c '^R[0-9] RANK=' "$out") -eq 4 ]] || fail "expected 4 workers"
  if [[ ${#extra_flags[@]} -eq 0 ]]; then
    grep -qxF "R3 MASTER_ADDR=n1" "$out" || fail "MASTER_ADDR is not the step's first node (n1)"
  fi

  local dry="$work/out/dry"
  if ! run_step dry -N2 --ntasks-per-node=1 -l "$wrapper" --dry_run; then
    fail "--dry_run under srun failed"
    cat "$dry"
    return
  fi
  local dry_job
  dry_job=$(grep -o -- '--rdzv_id=[0-9]*' "$dry" | head -1 | cut -d= -f2)
  local port=$((20000 + dry_job % 10000))
  for task in 0 1; do
    for want in "--nnodes=2" "--node_rank=$task" "--master_addr=n1" "--master_port=$port" "--rdzv_id=$dry_job" \
      "--rdzv_backend=static"; do
      grep -qxF -- "$task: $want" <(sed 's/^ *//' "$dry") || fail "node $task's dry run lacks $want"
    done
  done
}

scenario_restart() {
  local out="$work/out/restart"
  # Rank 3 (on n2) fails on the first attempt; the others would wait for it.
  cat >"$work/flaky.sh" <<'EOF'
#!/bin/bash
if [[ $TORCHELASTIC_RESTART_COUNT == 0 ]]; then
  if [[ $RANK == 3 ]]; then sleep 0.5; echo "rank 3 fails"; exit 7; fi
  exec sleep 60
fi
echo "done RANK=$RANK attempt=$TORCHELASTIC_RESTART_COUNT"
EOF
  chmod +x "$work/flaky.sh"
  if ! run_step restart -N2 --ntasks-per-node=1 "$wrapper" --nproc_per_node=2 --max_restarts=2 --term_timeout=5 \
    "${extra_flags[@]}" --no_python "$work/flaky.sh"; then
    fail "the job did not succeed after the restart"
    cat "$out"
    return
  fi
  grep -q "rank 3 fails" "$out" || fail "rank 3 never failed"
  for rank in 0 1 2 3; do
    grep -qxF "done RANK=$rank attempt=1" "$out" || fail "rank $rank did not finish on attempt 1"
  done
  ! grep -q "attempt=2" "$out" || fail "more restarts than the one failure"
}

scenario_scancel() {
  local out="$work/out/scancel"
  cat >"$work/sleeper.sh" <<EOF
#!/bin/bash
echo \$\$ >"$work/out/pid.\$RANK"
sleep 300 &
echo \$! >"$work/out/child.\$RANK"
echo "ready RANK=\$RANK WORLD_SIZE=\$WORLD_SIZE"
wait
EOF
  chmod +x "$work/sleeper.sh"
  # The sbatch example: ddprun-slurm starts the step from the batch script and takes 2
  # workers per node from --ntasks-per-node=2.
  local job_id
  job_id=$(cd "$source_dir" && env "$job_tag" sbatch --parsable -N2 --ntasks-per-node=2 --time=3 -o "$out" \
    scripts/ddprun.sbatch "${extra_flags[@]}" --no_python "$work/sleeper.sh")
  local ready=0
  for _ in $(seq 600); do
    if [[ -f "$out" && $(grep -c '^ready RANK=[0-3] WORLD_SIZE=4$' "$out") -eq 4 ]]; then
      ready=1
      break
    fi
    sleep 0.1
  done
  if ((!ready)); then
    fail "4 workers did not start within 60 s"
    cat "$out" 2>/dev/null
    squeue
    return
  fi
  local before
  before=$(pids_with_env "$job_tag" | wc -l)
  # srun, 2 x (slurm task: ddprun-slurm exec'd into ddprun, orphan guard), 4 workers, 4 sleeps at least.
  ((before >= 10)) || fail "only $before processes of the job found before scancel"
  scancel "$job_id"
  local gone=0
  for _ in $(seq 300); do
    if [[ -z $(squeue -h -j "$job_id" 2>/dev/null) && -z $(pids_with_env "$job_tag") ]]; then
      gone=1
      break
    fi
    sleep 0.1
  done
  if ((!gone)); then
    fail "processes left 30 s after scancel:"
    for pid in $(pids_with_env "$job_tag"); do ps -o pid,ppid,args -p "$pid" | tail -n +2; done
  fi
  for f in "$work"/out/pid.* "$work"/out/child.*; do
    local pid
    pid=$(cat "$f")
    ! kill -0 "$pid" 2>/dev/null || fail "worker process $pid ($f) still alive"
  done
}

scenario_ddp() {
  local out="$work/out/ddp"
  # The sbatch example as it stands: PyTorch DDP (gloo) on 2 nodes x 2 workers.
  local job_id
  job_id=$(cd "$source_dir" && env "$job_tag" sbatch --parsable --time=5 -o "$out" scripts/ddprun.sbatch \
    "${extra_flags[@]}" trainers/elastic_ddp.py --steps 20)
  local finished=0
  for _ in $(seq 1800); do
    if [[ -z $(squeue -h -j "$job_id" 2>/dev/null) ]]; then
      finished=1
      break
    fi
    sleep 0.1
  done
  ((finished)) || { fail "the job did not finish within 180 s"; scancel "$job_id"; }
  for rank in 0 1 2 3; do
    # python -u writes a line and its newline separately, so lines of two ranks may share one.
    grep -q "rank $rank: done, loss .* replicas in sync" "$out" || fail "rank $rank did not finish in sync"
  done
  grep -q "rank 0/4: started" "$out" || fail "no 4-rank job"
  if ((failures > 0)); then cat "$out"; fi
}

for scenario in "${scenarios[@]}"; do
  echo "--- $scenario"
  "scenario_$scenario"
done
if ((failures > 0)); then
  echo "FAILED: $failures check(s)"
  exit 1
fi
echo "PASSED: ${scenarios[*]}"
