# The run token on a real 2-process group (issue 11; docs/auth.md). With
# SLICETRAIN_TOKEN_FILE set:
#  A. ranks started by hand: while rank 0 waits for rank 1, hostile clients
#     connect to its rendezvous store and to its transport port with no
#     token, with a wrong token, replaying a captured handshake, with
#     garbage, and (store) saying nothing: each is refused and logged;
#     then rank 1 starts and both train to the end, exit 0.
#  B. `slicetrain launch` (coordinator on loopback): while it trains, every
#     listening TCP socket of the launcher and its workers is on a loopback
#     address; the same hostile clients hit each worker's transport port,
#     and a process of another user its unix control socket: each is
#     refused and logged; the run trains on to the end, exit 0.
#  C. refusals with a reason: no token and a coordinator beyond loopback
#     (exit 2), a token file readable by others (exit 2), ranks with
#     different tokens (the one refused exits 1, naming the handshake).
# timeout: 180
. "$(dirname "$0")/../cli_lib.sh"
umask 077
printf '%s\n' "a-run-token-for-the-auth-test-$RANDOM$RANDOM" >"$TMP/token"
chmod 600 "$TMP/token"
export SLICETRAIN_TOKEN_FILE="$TMP/token"
common=("$ST_ROOT/configs/base.yml" model_name=llama3-test max_target_length=128 per_device_batch_size=8
	dataset_type=synthetic base_output_directory="$TMP/o" enable_checkpointing=false)

# The TCP sockets pid $1 listens on, one per line: "ADDRESS PORT" (address
# in hex as /proc/net/tcp{,6} write it), from its fds' socket inodes.
listening() {
	/usr/bin/python3 - "$1" <<'PY'
import os, sys
pid = sys.argv[1]
inodes = set()
for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
        t = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        continue
    if t.startswith("socket:["):
        inodes.add(t[8:-1])
for f in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(f).readlines()[1:]:
        x = line.split()
        if x[3] == "0A" and x[9] in inodes:
            addr, port = x[1].split(":")
            print(addr, int(port, 16))
PY
}
# Is a /proc/net/tcp{,6} hex address loopback? (127/8, ::1, ::ffff:127.x)
is_loopback_hex() {
	/usr/bin/python3 - "$1" <<'PY'
import socket, struct, sys
h = sys.argv[1]
if len(h) == 8:
    a = socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(h, 16)))
    ok = a.startswith("127.")
else:
    b = b"".join(struct.pack("<I", int(h[i:i + 8], 16)) for i in range(0, 32, 8))
    a = socket.inet_ntop(socket.AF_INET6, b)
    ok = a == "::1" or a.startswith("::ffff:127.")
print(a)
sys.exit(0 if ok else 1)
PY
}

# hostile PORT KIND...: clients that must each be refused (the listener
# closes the connection); KIND: notoken, wrong, replay, garbage, silent.
hostile() {
	/usr/bin/python3 - "$@" <<'PY'
import hashlib, hmac, os, socket, sys, time
port, kinds = int(sys.argv[1]), sys.argv[2:]
wait = float(os.environ.get("HOSTILE_WAIT", "5"))  # for the listener's hello
token = open(os.environ["SLICETRAIN_TOKEN_FILE"], "rb").read().strip()
right = hashlib.sha256(token).digest()

def recv_exact(s, n):
    b = b""
    while len(b) < n:
        x = s.recv(n - len(b))
        if not x:
            break
        b += x
    return b

def refused(s, timeout):
    """The listener closes the connection (what it sent before, its hello, is read and ignored)."""
    end = time.time() + timeout
    try:
        while time.time() < end:
            s.settimeout(max(end - time.time(), 0.01))
            if s.recv(4096) == b"":
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        pass
    return False

def handshake(key, proof=None):
    s = socket.create_connection(("127.0.0.1", port), timeout=wait)
    hello = recv_exact(s, 36)
    assert hello[:4] == b"STA1", hello
    ns = hello[4:]
    nc = os.urandom(32)
    if proof is None:
        proof = b"STA1" + nc + hmac.new(key, b"c" + ns + nc, hashlib.sha256).digest()
    s.sendall(proof)
    return s, proof, ns, nc

bad = 0
for kind in kinds:
    if kind == "notoken":
        s, *_ = handshake(bytes(32))
    elif kind == "wrong":
        s, *_ = handshake(hashlib.sha256(b"not the token of this run, sorry").digest())
    elif kind == "replay":
        # a real exchange, captured, then its proof replayed on a new connection
        s0, proof, ns, nc = handshake(right)
        mac = recv_exact(s0, 32)
        if mac != hmac.new(right, b"s" + ns + nc, hashlib.sha256).digest():
            print(f"    port {port}: the captured exchange was not accepted")
            bad += 1
        s0.close()
        s, *_ = handshake(right, proof)
    elif kind == "garbage":
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(os.urandom(100))
    elif kind == "silent":
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
    t0 = time.time()
    ok = refused(s, 15 if kind == "silent" else wait)
    print(f"    port {port}, {kind}: {'refused' if ok else 'NOT refused'} after {time.time() - t0:.1f} s")
    bad += not ok
    s.close()
sys.exit(1 if bad else 0)
PY
}

# ---- A: the store and a transport port while the group forms ----
port=$(free_port)
start_rank() {
	SLICETRAIN_COORDINATOR=127.0.0.1:$port SLICETRAIN_RANK=$1 SLICETRAIN_WORLD_SIZE=2 SLICETRAIN_NUM_SLICES=2 \
		OMP_NUM_THREADS=1 "$SLICETRAIN" train "${common[@]}" steps=20 run_name=hand \
		>"$TMP/a.out.$1" 2>"$TMP/a.err.$1" &
}
start_rank 0
r0=$!
# rank 0 listens on the store's port and on its transport port
tport=
for _ in $(seq 1 200); do
	ports=$(listening $r0 2>/dev/null | awk '{print $2}')
	tport=$(echo "$ports" | grep -vx "$port" | head -1)
	echo "$ports" | grep -qx "$port" && [ -n "$tport" ] && break
	kill -0 $r0 2>/dev/null || break
	sleep 0.05
done
if [ -z "$tport" ]; then
	fail "A: rank 0 did not listen on the store port $port and a transport port: $(tail -2 "$TMP/a.err.0")"
else
	echo "A: rank 0 waits for rank 1: store on port $port, transport on port $tport"
	hostile "$port" notoken wrong replay garbage silent || fail "A: a hostile client got into the store"
fi
# the transport's connections wait in its backlog until rank 0's monitor
# starts, once the group formed: they must not get in the way of the join
[ -n "$tport" ] && HOSTILE_WAIT=60 hostile "$tport" notoken wrong replay garbage >"$TMP/a.hostile" 2>&1 &
hpid=$!
sleep 0.5
start_rank 1
r1=$!
wait $r0; rc0=$?
wait $r1; rc1=$?
wait $hpid || fail "A: a hostile client got into the transport"
cat "$TMP/a.hostile"
status_is "A: rank 0 after the hostile clients" $rc0 0 "$TMP/a.err.0"
status_is "A: rank 1" $rc1 0 "$TMP/a.err.1"
n=$(grep -c '^completed step' "$TMP/a.out.0")
[ "$n" -eq 20 ] || fail "A: rank 0 trained $n steps, want 20"
ns=$(grep -c 'rendezvous store: connection dropped from 127.0.0.1' "$TMP/a.err.0")
nt=$(grep -c 'worker group rank 0: connection dropped from 127.0.0.1' "$TMP/a.err.0")
grep 'connection dropped' "$TMP/a.err.0" | sed 's/^/    /'
[ "$ns" -ge 5 ] || fail "A: $ns drops logged by the store, want 5 (no token, wrong, replay, garbage, silent)"
[ "$nt" -ge 4 ] || fail "A: $nt drops logged by the transport, want 4 (no token, wrong, replay, garbage; and the captured exchange's close)"
grep -q "$(cat "$TMP/token")" "$TMP"/a.err.* && fail "A: the token appears in a log"

# ---- B: a launched run: loopback only, transports and unix sockets under attack ----
# long enough for the hostile clients (about 1 s; 10 s here): steps paced to
# 0.1 s (SLICETRAIN_MIN_STEP_SECONDS; the workers sleep the rest), not burnt
bsteps=100
SLICETRAIN_MIN_STEP_SECONDS=0.1 "$SLICETRAIN" launch --num-slices 2 --devices-per-slice 1 -- "${common[@]}" steps=$bsteps run_name=launched \
	>"$TMP/b.out" 2>"$TMP/b.err" &
launcher=$!
for _ in $(seq 1 600); do
	grep -q 'completed step' "$TMP/b.out" 2>/dev/null && break
	kill -0 $launcher 2>/dev/null || break
	sleep 0.1
done
workers=($(pgrep -P $launcher))
[ ${#workers[@]} -eq 2 ] || fail "B: ${#workers[@]} workers, want 2"
grep -q 'completed step' "$TMP/b.out" || fail "B: no training within 60 s: $(tail -2 "$TMP/b.err")"
nlisten=0
for p in $launcher "${workers[@]}"; do
	while read -r hex lport; do
		nlisten=$((nlisten + 1))
		if a=$(is_loopback_hex "$hex"); then
			echo "B: pid $p listens on $a port $lport (loopback)"
		else
			fail "B: pid $p listens on $a port $lport: not loopback"
		fi
	done < <(listening "$p")
done
[ $nlisten -ge 2 ] || fail "B: found $nlisten listening sockets, want at least the 2 transports"
for w in "${workers[@]}"; do
	wport=$(listening "$w" | awk '{print $2}' | head -1)
	[ -n "$wport" ] || { fail "B: worker $w listens on no TCP port"; continue; }
	hostile "$wport" notoken wrong replay garbage || fail "B: a hostile client got into worker $w's transport"
	# its unix control socket, from a process of another user
	/usr/bin/python3 - "$w" <<'PY' || fail "B: another user got into worker $w's unix socket"
import os, socket, sys
pid = sys.argv[1]
inodes = {os.readlink(f"/proc/{pid}/fd/{f}")[8:-1] for f in os.listdir(f"/proc/{pid}/fd")
          if os.readlink(f"/proc/{pid}/fd/{f}").startswith("socket:[")}
names = [l.split()[7] for l in open("/proc/net/unix").readlines()[1:]
         if len(l.split()) > 7 and l.split()[6] in inodes and l.split()[7].startswith("@slicetrain.")]
if not names:
    sys.exit(print(f"    worker {pid}: no unix control socket found") or 1)
if os.getuid() != 0:
    print(f"    worker {pid}: not root, cannot act as another user: skipped")
    sys.exit(0)
child = os.fork()
if child == 0:
    os.setgid(65534)
    os.setuid(65534)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect("\0" + names[0][1:])
    s.settimeout(5)
    try:
        os._exit(0 if s.recv(64) == b"" else 1)
    except (ConnectionResetError, socket.timeout):
        os._exit(0)
_, st = os.waitpid(child, 0)
ok = os.waitstatus_to_exitcode(st) == 0
print(f"    worker {pid}, unix socket {names[0]} as uid 65534: {'refused' if ok else 'NOT refused'}")
sys.exit(0 if ok else 1)
PY
done
kill -0 $launcher 2>/dev/null || fail "B: the run ended before the hostile clients were done (raise steps)"
at=$(grep -c '^completed step' "$TMP/b.out")
wait $launcher; rc=$?
status_is "B: the launched run under hostile clients" $rc 0 "$TMP/b.err"
n=$(grep -c '^completed step' "$TMP/b.out")
echo "B: $at steps done when the hostile clients were done, $n at the end"
[ "$n" -eq $bsteps ] || fail "B: trained $n steps, want $bsteps"
grep 'connection dropped' "$TMP/b.err" | sed 's/^/    /'
for r in 0 1; do
	nt=$(grep -c "worker group rank $r: connection dropped from 127.0.0.1" "$TMP/b.err")
	nu=$(grep -c "worker group rank $r: connection dropped from local .*another user" "$TMP/b.err")
	[ "$nt" -ge 4 ] || fail "B: rank $r logged $nt transport drops, want 4"
	[ "$nu" -ge 1 ] || [ "$(id -u)" -ne 0 ] || fail "B: rank $r logged no unix drop of another user"
done
grep -q "$(cat "$TMP/token")" "$TMP/b.err" "$TMP/b.out" && fail "B: the token appears in a log"

# ---- C: refusals ----
c_run() { # NAME RANK TOKEN_FILE COORDINATOR [env...]: starts rank RANK of 2
	local name=$1 rank=$2 tf=$3 coord=$4; shift 4
	env SLICETRAIN_TOKEN_FILE="$tf" SLICETRAIN_COORDINATOR="$coord" SLICETRAIN_RANK=$rank \
		SLICETRAIN_WORLD_SIZE=2 SLICETRAIN_NUM_SLICES=2 SLICETRAIN_JOIN_TIMEOUT_MS=5000 OMP_NUM_THREADS=1 "$@" \
		"$SLICETRAIN" train "${common[@]}" steps=2 run_name=$name >"$TMP/$name.out" 2>"$TMP/$name.err"
}
unset SLICETRAIN_TOKEN_FILE
c_check() { # NAME RC WANT PATTERN
	status_is "C: $1" "$2" "$3" "$TMP/$1.err" || return
	if grep '^slicetrain: error:' "$TMP/$1.err" | grep -qE -- "$4"; then
		echo "C: $1: $(grep '^slicetrain: error:' "$TMP/$1.err" | cut -c1-200)"
	else
		fail "C: $1: no error matching /$4/: $(tail -2 "$TMP/$1.err")"
	fi
}
env -u SLICETRAIN_TOKEN_FILE SLICETRAIN_COORDINATOR=10.255.255.1:$port SLICETRAIN_RANK=1 SLICETRAIN_WORLD_SIZE=2 \
	SLICETRAIN_NUM_SLICES=2 OMP_NUM_THREADS=1 "$SLICETRAIN" train "${common[@]}" steps=2 run_name=c \
	>"$TMP/notoken.out" 2>"$TMP/notoken.err"
c_check notoken $? 2 "refusing to listen on 10.255.255.1 without a run token.*SLICETRAIN_TOKEN_FILE"
cp "$TMP/token" "$TMP/token644" && chmod 644 "$TMP/token644"
c_run mode644 0 "$TMP/token644" 127.0.0.1:$port
c_check mode644 $? 2 "token644: the token file has mode 0644"
printf 'another token, also long enough\n' >"$TMP/token2"
chmod 600 "$TMP/token2"
port=$(free_port)
c_run mismatch0 0 "$TMP/token" 127.0.0.1:$port &
m0=$!
c_run mismatch1 1 "$TMP/token2" 127.0.0.1:$port
m1rc=$?
wait $m0; m0rc=$?
c_check mismatch1 $m1rc 1 "handshake failed.*(refused this process's proof|different token)"
status_is "C: rank 0 of the mismatched pair (3: rank 1 never joined)" $m0rc 3 "$TMP/mismatch0.err" &&
	echo "C: mismatch0: $(grep '^slicetrain: error:' "$TMP/mismatch0.err" | cut -c1-160)"
grep -q 'rendezvous store: connection dropped' "$TMP/mismatch0.err" || fail "C: rank 0's store did not log the refused rank"
finish
