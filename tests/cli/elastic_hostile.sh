# The controller against malformed and hostile input: while a 2-slice
# elastic run trains, fake agents connect to its port and send invalid JSON,
# a non-object, an unknown type, a line over the 64 KiB limit, a hello with
# a slice out of range, a hello for a host that already has its agent, a
# hello with a wrong version, a message before hello, and one connects and
# says nothing, plus a status request; all of these after a correct token
# proof (comm/auth.h). Then the handshake itself: a connection without the
# proof (a hello line at once), with a wrong token's proof, replaying a proof
# captured from an accepted connection, and one that stops in the middle of
# its proof. Each is dropped and logged (the three hellos that make sense
# but cannot join are refused with their reason: a "refused" answer, then
# the connection closed); the run goes on and finishes with 0
# failures; no process left behind. The run's 60 paced steps (12 s) outlast
# the fake agents (about 6 s: the silent one waits out the controller's 5 s
# handshake timeout).
# timeout: 120
# load: light
. "$(dirname "$0")/../cli_lib.sh"
. "$(dirname "$0")/elastic_lib.sh"
# the run's token: a file of ours (the launcher uses it instead of making one)
printf 'hostile-test token %s\n' "$RANDOM$RANDOM$RANDOM" >"$TMP/token"
chmod 600 "$TMP/token"
export SLICETRAIN_TOKEN_FILE="$TMP/token"
el_start host --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 2 -- "${el_keys[@]}" steps=60 \
	run_name=host metrics_file="$TMP/host.jsonl"
controller_of "$TMP/host.err" "$TMP/host.out" "$el_pid" $((300 * el_scale))
[ -n "$addr" ] || fail "the launcher printed no controller address"
/usr/bin/python3 - "${addr##*:}" "$TMP/token" <<'PY' || fail "the fake agents"
import hashlib, hmac, json, os, socket, sys, time
port = int(sys.argv[1])
key = hashlib.sha256(open(sys.argv[2], "rb").read().strip()).digest()
def recv_n(s, n):
    b = b""
    while len(b) < n:
        x = s.recv(n - len(b))
        if not x:
            raise ConnectionResetError("closed")
        b += x
    return b
def proof(hello, k=key, nc=None):
    assert hello[:4] == b"STA1"
    nc = nc or os.urandom(32)
    return b"STA1" + nc + hmac.new(k, b"c" + hello[4:] + nc, hashlib.sha256).digest()
def connect(auth=True):
    """a connection with the token proved (the controller's answer checked)"""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    if auth:
        h = recv_n(s, 36)
        p = proof(h)
        s.sendall(p)
        a = recv_n(s, 32)
        if not hmac.compare_digest(a, hmac.new(key, b"s" + h[4:] + p[4:36], hashlib.sha256).digest()):
            sys.exit("the controller's answer to our proof is wrong")
    return s
hello = {"type": "hello", "version": 3, "slice": 0, "host": 0, "hosts_per_slice": 1, "devices": 1, "pid": 1,
         "addr": "127.0.0.1", "port": 9, "build": "0" * 16, "release": "0"}
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
    ("running: not an object", (json.dumps(dict(hello, slice=1, running=[1])) + "\n").encode()),
    ("running: world and slices disagree",
     (json.dumps(dict(hello, slice=1, running={"gen": 3, "world": 2, "slices": [1], "workers": []})) + "\n").encode()),
    ("running: a slice twice",
     (json.dumps(dict(hello, slice=1, running={"gen": 3, "world": 2, "slices": [1, 1], "workers": []})) + "\n").encode()),
    ("running: another host's rank",
     (json.dumps(dict(hello, slice=1, running={"gen": 3, "world": 2, "slices": [0, 1],
                                                "workers": [{"rank": 0, "pid": 5}]})) + "\n").encode()),
    ("NUL bytes", b'\0\0\0\0\n'),
]
# the handshake's own cases: (name, bytes to send after reading the hello)
captured = {}
def first_proof(h):
    captured["p"] = proof(h)
    return captured["p"]
s = socket.create_connection(("127.0.0.1", port), timeout=5)
h = recv_n(s, 36)
s.sendall(first_proof(h))
recv_n(s, 32)  # accepted: the proof to replay
s.close()
auth_cases = [
    ("no token proof (a hello line at once)", lambda h: (json.dumps(hello) + "\n").encode() * 2),
    ("a wrong token", lambda h: proof(h, k=hashlib.sha256(b"not the token").digest())),
    ("a replayed proof", lambda h: captured["p"]),
    ("a garbage proof", lambda h: b"STA1" + b"\xff" * 64),
]
def dropped(s):
    s.settimeout(7)
    try:
        while True:
            b = s.recv(4096)
            if not b:
                return True
            if b'"welcome"' in b:
                return False
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
for name, make in auth_cases:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    h = recv_n(s, 36)
    try:
        s.sendall(make(h))
    except OSError:
        pass
    ok = dropped(s)
    s.close()
    print(f"    fake agent, {name}: {'dropped' if ok else 'NOT dropped'}")
    if not ok:
        sys.exit(1)
# one that stops in the middle of its proof: dropped at the hello timeout
half = socket.create_connection(("127.0.0.1", port), timeout=10)
half.sendall(proof(recv_n(half, 36))[:40])
for name, data in cases:
    s = connect()
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
idle = connect()
idle.settimeout(10)
s = connect()
s.sendall(b'{"type": "status"}\n')
ans = json.loads(s.makefile().readline())
print(f"    status: state {ans['state']}, {len(ans['slices'])} slices")
t0 = time.time()
closed = idle.recv(1) == b""
print(f"    silent connection dropped after {time.time() - t0:.1f} s")
half.settimeout(10)
half_closed = dropped(half)
print(f"    half a proof: {'dropped' if half_closed else 'NOT dropped'}")
sys.exit(not closed or not half_closed or len(ans["slices"]) != 2)
PY
el_wait host 90
status_is "the run under hostile input" "$el_rc" 0 "$TMP/host.err"
grep -E 'connection dropped from|dropping' "$TMP/host.err" | sed 's/^/    /'
grep -E 'refusing' "$TMP/host.err" | sed 's/^/    /'
n=$(grep -cE 'controller: connection dropped from|controller: \[ *[0-9.]+\] refusing' "$TMP/host.err")
[ "$n" -ge 21 ] || fail "$n drops and refusals logged, want 21 (15 bad inputs: 3 of them, a slice out of range, a duplicate host and a wrong version, refused with a reason; a silent connection, 5 failed proofs)"
[ "$(grep -cE 'refusing' "$TMP/host.err")" -ge 3 ] || fail "fewer than 3 hellos refused with a reason"
[ "$(grep -c 'connection dropped from .*token' "$TMP/host.err")" -ge 4 ] ||
	fail "the failed proofs were not logged as such"
grep -q "$(head -c 40 "$TMP/token" | tr -d '\n')" "$TMP/host.err" "$TMP/host.out" && fail "the token appears in the output"
sum=$(el_summary host)
echo "summary: $(echo $sum)"
[ "$(echo "$sum" | el_get failures)" = 0 ] || fail "hostile input caused failures"
finish
