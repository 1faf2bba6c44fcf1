#!/usr/bin/env bash
# bench/rdzv_sim at a small scale: 512 simulated agents in client processes against one store
# server. Every phase must hold its checks (each group rank and RANK base handed out once, all
# 512 status records read back, 511 hang summaries gathered, each agent's events written, the
# re-form with 511 nodes, the exit barrier), the run must exit 0 with wrong=0, and the last
# line must be the well-formed summary. No timing is asserted; the store operations per agent
# are (they must not grow with the job). Every process it starts is the benchmark's child and
# dies with it.
# Usage: tests/bench/rdzv_sim_test.sh BIN_DIR
set -euo pipefail
[[ $# -eq 1 ]] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
fail() { echo "FAIL: $*" >&2; exit 1; }
rc=0
out=$(timeout 120 "$1/rdzv_sim" 512 --last-call 1 2>&1) || rc=$?
echo "$out"
((rc == 0)) || fail "rdzv_sim exited $rc"
last=$(echo "$out" | tail -1)
num='[0-9]+(\.[0-9]+)?'
re="^rdzv_sim participants=512 seconds=$num ops_per_agent=$num status_seconds=$num status_read_seconds=$num"
re+=" hang_seconds=$num events_seconds=$num events_bytes_per_agent=$num reform_seconds=$num reform_ops_per_agent=$num exit_seconds=$num exit_ops_per_agent=$num wrong=0$"
[[ "$last" =~ $re ]] || fail "malformed last line: $last"
# Columns: phase agents seconds ops/agent ops_max bytes/agent bytes_max wrong srv_cpu
row() { echo "$out" | awk -v s="$1" '$1 == s'; }
for phase in round status hang events reform exit; do
  read -r _ agents _ _ ops_max _ _ wrong _ <<<"$(row "$phase")"
  [[ -n "$agents" ]] || fail "no $phase row"
  ((wrong == 0)) || fail "$phase: $wrong wrong"
  # O(1) per agent: no agent makes more than a handful of store operations in a phase, except
  # the hang verdict's judge: two per look (every 100 ms while answers come, over the agents'
  # 2 s cadence) and one per 15 answers, about 80 here; reading each node's key at every look,
  # as it once did, is over 1,000 per look.
  limit=16
  [[ $phase == hang ]] && limit=400
  ((ops_max <= limit)) || fail "$phase: an agent made $ops_max store operations (at most $limit expected)"
done
# Each agent's events file holds its round's 10 events (about 1.8 KB), and no store traffic.
read -r _ _ _ ops _ event_bytes _ <<<"$(row events)"
[[ "$ops" == 0.0 ]] || fail "events: $ops store operations per agent, expected none"
awk -v b="$event_bytes" 'BEGIN { exit !(b > 1000 && b < 4000) }' || fail "events: $event_bytes bytes per agent"
read -r _ agents _ <<<"$(row round)"
((agents == 512)) || fail "round: $agents agents, expected 512"
read -r _ agents _ <<<"$(row exit)"
((agents == 511)) || fail "exit: $agents agents, expected 511 (one node left before the re-form)"
# A bad argument is one line naming it and exit status 2.
rc=0
err=$("$1/rdzv_sim" 512 --procs nope 2>&1) || rc=$?
((rc == 2)) || fail "--procs nope exited $rc, expected 2"
[[ $(echo "$err" | wc -l) -eq 1 && "$err" == *"--procs"* ]] || fail "bad argument message: $err"
echo "PASS"
