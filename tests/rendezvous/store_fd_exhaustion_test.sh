#!/usr/bin/env bash
# The store out of file descriptors: ddprun_store_server under `ulimit -n 32` is sent 80
# connections held open for 3 s. accept() fails with EMFILE for most of them; the server
# must back off and log a handful of lines (it once retried at once: a core at 100% and over
# a million "accept failed" lines in 6 s), then serve a new client once descriptors free up.
# Its subject is the server's back-off over real time (a timer of its own, up to 1 s), so it
# is an integration test (docs/testing.md): the 3 s hold is the window the log is counted in.
# Usage: tests/rendezvous/store_fd_exhaustion_test.sh BIN_DIR
set -euo pipefail
[[ $# -eq 1 ]] || { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
bin=$1
python=/usr/bin/python3
work=$(mktemp -d "${TMPDIR:-/tmp}/ddprun-fd-XXXXXX")
server_pid=
cleanup() {
  exec 3<&-
  if [[ -n "$server_pid" ]]; then
    kill -9 "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Its stdout through a FIFO: the announcement is read as it comes (10 s at most: a guard).
mkfifo "$work/out"
(ulimit -n 32 && exec "$bin/ddprun_store_server" --host 127.0.0.1 --port 0) >"$work/out" 2>"$work/err" &
server_pid=$!
exec 3<"$work/out"
announcement=
IFS= read -r -t 10 announcement <&3 || true
port=$(sed -n 's/^listening on \([0-9]*\)$/\1/p' <<<"$announcement")
[[ -n "$port" ]] || fail "the store server did not start: $announcement $(cat "$work/err")"

timeout 60 "$python" - "$port" <<'PY' || fail "the client side of the test failed"
import socket, struct, sys, time
port = int(sys.argv[1])
held = []
for _ in range(80):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    held.append(s)
time.sleep(3)
for s in held:
    s.close()
# A new client is served once the server's back-off (1 s at most) has run out: VALIDATE, then
# PING 7 -> 7, the reply waited for (10 s at most: a guard).
s = socket.create_connection(("127.0.0.1", port), timeout=10)
s.sendall(bytes([0]) + struct.pack("<I", 0x3C85F7CE) + bytes([13]) + struct.pack("<I", 7))
reply = b""
while len(reply) < 4:
    chunk = s.recv(4 - len(reply))
    if not chunk:
        sys.exit("the server closed the new connection")
    reply += chunk
if struct.unpack("<I", reply)[0] != 7:
    sys.exit("bad PING reply")
print("served a new client after the descriptors came back")
PY
kill -0 "$server_pid" 2>/dev/null || fail "the store server died: $(tail -3 "$work/err")"
lines=$(grep -c "accept failed" "$work/err" || true)
echo "accept failure log lines: $lines"
grep -m1 "accept failed" "$work/err" || fail "accept never failed: the test did not exhaust the descriptors"
((lines <= 5)) || fail "$lines accept-failure lines in about 4 s (a log flood)"
echo "PASS"
