# The controller against malformed and hostile input: while a 2-slice
# elastic run trains, fake agents connect to its port and send invalid JSON,
# a non-object, an unknown type, a line over the 64 KiB limit, a hello with
# a slice out of range, a hello for a host that already has its agent, a
# hello with a wrong version, a message before hello, and one connects and
# says nothing, plus a status request. Each is dropped and logged; the run
# goes on and finishes with 0 failures; no process left behind.
# timeout: 120
. "$(dirname "$0")/../cli_lib.sh"
. "$(dirname "$0")/elastic_lib.sh"
el_start host --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 2 -- "${el_keys[@]}" steps=100 \
	run_name=host metrics_file="$TMP/host.jsonl"
addr=
for _ in $(seq 1 $((300 * el_scale))); do
	addr=$(sed -n 's/^slicetrain launch: elastic controller at \([^ ]*\) .*/\1/p' "$TMP/host.err")
	[ -n "$addr" ] && grep -q 'completed step' "$TMP/host.out" && break
	kill -0 "$el_pid" 2>/dev/null || break
	sleep 0.1
done
[ -n "$addr" ] || fail "the launcher printed no controller address"
/usr/bin/python3 - "${addr##*:}" <<'PY' || fail "the fake agents"
import json, socket, sys, time
port = int(sys.argv[1])
hello = {"type": "hello", "version": 1, "slice": 0, "host": 0, "hosts_per_slice": 1, "devices": 1, "pid": 1}
cases = [
    ("invalid JSON", b'{"type": "hello", \n'),
    ("a non-object", b'[1, 2, 3]\n'),
    ("an unknown type", b'{"type": "gimme"}\n'),
    ("a huge line", b'{"type": "hello", "x": "' + b"A" * (100 << 10) + b'"}\n'),
    ("a slice out of range", (json.dumps(dict(hello, slice=7)) + "\n").encode()),
    ("a duplicate host", (json.dumps(hello) + "\n").encode()),
    ("a wrong version", (json.dumps(dict(hello, version=99)) + "\n").encode()),
    ("a heartbeat before hello", b'{"type": "heartbeat"}\n'),
    ("a negative slice", (json.dumps(dict(hello, slice=-1)) + "\n").encode()),
    ("a string slice", (json.dumps(dict(hello, slice="0")) + "\n").encode()),
    ("NUL bytes", b'\0\0\0\0\n'),
]
for name, data in cases:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(data)
    except OSError:
        pass  # the controller may close while the huge line is in flight
    # dropped: the controller closes the connection (a bounded wait)
    s.settimeout(5)
    closed = False
    try:
        while True:
            b = s.recv(4096)
            if not b:
                closed = True
                break
            if b'"welcome"' in b:
                break
    except (ConnectionResetError, socket.timeout):
        closed = True if not isinstance(sys.exc_info()[1], socket.timeout) else False
    s.close()
    print(f"    fake agent, {name}: {'dropped' if closed else 'NOT dropped'}")
    if not closed:
        sys.exit(1)
# a connection that says nothing: dropped after the hello timeout; a status request answered
idle = socket.create_connection(("127.0.0.1", port), timeout=10)
s = socket.create_connection(("127.0.0.1", port), timeout=5)
s.sendall(b'{"type": "status"}\n')
ans = json.loads(s.makefile().readline())
print(f"    status: state {ans['state']}, {len(ans['slices'])} slices")
t0 = time.time()
closed = idle.recv(1) == b""
print(f"    silent connection dropped after {time.time() - t0:.1f} s")
sys.exit(not closed or len(ans["slices"]) != 2)
PY
el_wait host 90
status_is "the run under hostile input" "$el_rc" 0 "$TMP/host.err"
grep -E 'connection dropped|dropping' "$TMP/host.err" | sed 's/^/    /'
n=$(grep -cE 'connection dropped' "$TMP/host.err")
[ "$n" -ge 12 ] || fail "$n drops logged, want 12 (11 bad inputs and a silent connection)"
sum=$(el_summary host)
echo "summary: $(echo $sum)"
[ "$(echo "$sum" | el_get failures)" = 0 ] || fail "hostile input caused failures"
finish
