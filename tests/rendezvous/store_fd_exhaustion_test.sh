#!/usr/bin/env bash
# The store out of file descriptors: ddprun_store_server under `ulimit -n 32` is sent 80
# connections held open for 3 s. accept() fails with EMFILE for most of them; the server
# must back off and log a handful of lines (it once retried at once: a core at 100% and over
# a million "accept failed" lines in 6 s), then serve a new client once descriptors free up.
# Usage: tests/rendezvous/store_fd_exhaustion_test.sh BIN_DIR
set -euo pipefail
[[ $# -eq 1 ]] || { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
bin=$1
python=/usr/bin/python3
work=$(mktemp -d "${TMPDIR:-/tmp}/ddprun-fd-XXXXXX")
server_pid=
cleanup() {
  if [[ -n "$server_pid" ]]; then
    kill -9 "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

(ulimit -n 32 && exec "$bin/ddprun_store_server" --host 127.0.0.1 --port 0) >"$work/out" 2>"$work/err" &
server_pid=$!
for _ in $(seq 100); do grep -q "listening on" "$work/out" && break; sleep 0.05; done
port=$(sed -n 's/^listening on \([0-9]*\)$/\1/p' "$work/out")
[[ -n "$port" ]] || fail "the store server did not start: $(cat "$work/err")"

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
time.sleep(1.5)  # past the longest back-off
# A new client is served: VALIDATE, then PING 7 -> 7.
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
((lines <= 5)) || fail "$lines accept-failure lines in about 5 s (a log flood)"
echo "PASS"
