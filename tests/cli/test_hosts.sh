# The test hosts library (tests/hosts_lib.sh; docs/testing.md, "Test hosts"):
# two switches joined by a trunk, hosts a and b on s1 and c on s2, a TCP
# server (python3) on each. Hosts reach each other; the root namespace
# cannot reach them and has no new interface or route. th_shape_trunk and
# th_shape_host at 32mbit make 4 MB (2 MB) each way at least 3x slower than
# unshaped and no faster than twice the rate; th_unshape removes the
# qdiscs. th_cut: an open connection sees no FIN from a killed peer, a new
# connect fails; th_mend restores. th_drop 1.0 blocks, th_undrop restores.
# th_throttle 0.1 keeps a busy loop under 30% of a CPU. th_down leaves
# nothing (th_leftovers empty), also for a script that fails midway (exit
# 1) and one killed by SIGTERM. It does not use the build under test:
# tests/run.sh runs it on the first build only.
# timeout: 60
# builds: first
# load: light
. "$(dirname "$0")/../cli_lib.sh"
. "$ST_ROOT/tests/hosts_lib.sh"
PY=/usr/bin/python3

# srv.py PORT: each connection sends one line: "PUT N" (N bytes follow; the
# reply is "N"), "GET N" (N bytes come back) or "HOLD" (reply "ok", then
# read until EOF)
cat >"$TMP/srv.py" <<'PY'
import socket, sys, threading
def serve(c):
    with c:
        f = c.makefile("rb")
        cmd = f.readline().split()
        if cmd[0] == b"PUT":
            n, left = int(cmd[1]), int(cmd[1])
            while left > 0:
                b = f.read1(min(left, 1 << 16))
                if not b: break
                left -= len(b)
            c.sendall(b"%d\n" % (n - left))
        elif cmd[0] == b"GET":
            c.sendall(b"x" * int(cmd[1]))
        elif cmd[0] == b"HOLD":
            c.sendall(b"ok\n")
            while c.recv(4096): pass
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(16)
while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
PY
# cli.py HOST PORT PUT|GET N TIMEOUT: prints the seconds it took (connect
# included), exit 1 on an error; cli.py HOST PORT HOLD 0 TIMEOUT: prints
# "held", then how the connection ended within TIMEOUT: eof, reset, timeout
cat >"$TMP/cli.py" <<'PY'
import socket, sys, time
host, port, cmd, n, timeout = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
t0 = time.monotonic()
try:
    c = socket.create_connection((host, port), timeout=timeout)
    c.sendall(b"%s %d\n" % (cmd.encode(), n))
    if cmd == "PUT":
        c.sendall(b"x" * n)
        got = c.makefile("rb").readline()
        if int(got) != n: sys.exit(f"sent {n}, server got {got!r}")
    elif cmd == "GET":
        got = 0
        while got < n:
            b = c.recv(1 << 16)
            if not b: sys.exit(f"got {got} of {n} bytes")
            got += len(b)
    else:
        if c.makefile("rb").readline() != b"ok\n": sys.exit("no ok")
        print("held", flush=True)
        try:
            print("eof" if not c.recv(1) else "data")
        except socket.timeout:
            print("timeout")
        except ConnectionResetError:
            print("reset")
        sys.exit(0)
except (OSError, ValueError) as e:
    sys.exit(f"{host}:{port} {cmd}: {e}")
print(f"{time.monotonic() - t0:.3f}")
PY
# put FROM TO N [TIMEOUT] / get FROM TO N [TIMEOUT]: from host FROM, to (from)
# host TO's server; prints the seconds
put() { th_exec "$1" $PY "$TMP/cli.py" "$(th_addr "$2")" 5000 PUT "$3" "${4:-5}"; }
get() { th_exec "$1" $PY "$TMP/cli.py" "$(th_addr "$2")" 5000 GET "$3" "${4:-5}"; }
# srv NAME: start host NAME's server, wait (5 s at most) until a connects
srv() {
	local i
	th_bg "$1" "$TMP/srv.$1" $PY "$TMP/srv.py" 5000 || return 1
	srv_pid[$1]=$TH_PID
	for i in $(seq 1 50); do
		put a "$1" 1 1 >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	fail "server on $1 not reachable from a in 5 s: $(cat "$TMP/srv.$1")"
	return 1
}
# slower NAME SECS_SHAPED SECS_FREE BYTES RATE_BITS: shaped at least 3x slower
# than free and no faster than twice the rate
slower() {
	if awk -v s="$2" -v f="$3" -v b="$4" -v r="$5" 'BEGIN { exit !(s >= 3 * f && s >= b * 8 / (2 * r)) }'; then
		echo "ok   $1: $2 s shaped, $3 s unshaped"
	else
		fail "$1: $2 s shaped, $3 s unshaped (want at least 3x and at least $(awk -v b="$4" -v r="$5" 'BEGIN { print b * 8 / (2 * r) }') s)"
	fi
}
tbfs() { tc -n "$1" qdisc show dev "$2" | grep -c '^qdisc tbf'; }
rootnet() { ip -o link show | awk '{ print $2 }'; ip route show; ip -6 route show; }
cpu_ticks() { local l; read -r l <"/proc/$1/stat"; l=(${l##*) }); echo $((l[11] + l[12])); }

rootnet >"$TMP/root.before"
declare -A srv_pid
th_init || { fail "th_init"; finish; }
echo "run $TH_ID"
{ th_switch s1 && th_switch s2 && th_trunk s1 s2 && th_host a 10.213.1.1 s1 &&
	th_host b 10.213.1.2 s1 && th_host c 10.213.2.1 s2; } || { fail "setting up the hosts"; finish; }

# bad calls fail and say why
th_trunk s2 s1 2>"$TMP/err" && fail "a second trunk s2-s1 (a loop) was made"
grep -q 'loop' "$TMP/err" || fail "th_trunk s2 s1: $(cat "$TMP/err")"
th_host d 10.214.0.1 s1 2>/dev/null && fail "th_host took an address outside 10.213.0.0/16"
th_host a 10.213.1.9 s1 2>/dev/null && fail "th_host made a second host a"
[ "$(th_addr c)" = 10.213.2.1 ] || fail "th_addr c: $(th_addr c)"

# every host reaches the others by TCP, across the trunk too
srv a && srv b && srv c || finish
for pair in "a b" "a c" "b c" "c a" "c b" "b a"; do
	set -- $pair
	put "$1" "$2" 5 >/dev/null 2>"$TMP/err" || fail "$1 -> $2: $(cat "$TMP/err")"
done
echo "ok   a, b and c reach each other"
# the root namespace: no route to them, no new interface or route
$PY "$TMP/cli.py" 10.213.1.1 5000 PUT 5 1 >/dev/null 2>&1 && fail "the root namespace reached 10.213.1.1"
rootnet >"$TMP/root.after"
diff "$TMP/root.before" "$TMP/root.after" >"$TMP/diff" || fail "the root namespace changed: $(cat "$TMP/diff")"
th_exec a ip -o link show | grep -q 'alias st-' || fail "a's interfaces carry no alias st-$TH_ID"

# shaping the trunk: a <-> c, 4 MB each way, at 32mbit (1 s at the rate)
big=$((4 << 20)) rate=32000000
free_put=$(put a c $big) && free_get=$(get a c $big) || fail "unshaped a <-> c failed"
th_shape_trunk s1 s2 32mbit || fail "th_shape_trunk"
[ "$(tbfs "$(th_ns s1)" t1-s2)$(tbfs "$(th_ns s2)" t1-s1)" = 11 ] || fail "no tbf on both trunk ends"
shaped_put=$(put a c $big 20) && shaped_get=$(get a c $big 20) || fail "shaped a <-> c failed"
slower "trunk a->c" "${shaped_put:-0}" "${free_put:-0}" $big $rate
slower "trunk c->a" "${shaped_get:-0}" "${free_get:-0}" $big $rate
th_unshape s1 s2
[ "$(tbfs "$(th_ns s1)" t1-s2)$(tbfs "$(th_ns s2)" t1-s1)" = 00 ] || fail "th_unshape left a tbf on the trunk"
# shaping a host: a <-> b, 2 MB each way
mid=$((2 << 20))
free_put=$(put a b $mid) && free_get=$(get a b $mid) || fail "unshaped a <-> b failed"
th_shape_host a 32mbit || fail "th_shape_host"
shaped_put=$(put a b $mid 20) && shaped_get=$(get a b $mid 20) || fail "shaped a <-> b failed"
slower "host a->b" "${shaped_put:-0}" "${free_put:-0}" $mid $rate
slower "host b->a" "${shaped_get:-0}" "${free_get:-0}" $mid $rate
th_unshape a
[ "$(tbfs "$(th_ns a)" eth0)" = 0 ] || fail "th_unshape a left a tbf"

# th_cut: a holds a connection to c; c's link is cut and its server killed:
# a sees no FIN or RST, a new connect fails; th_mend restores
th_bg a "$TMP/hold" $PY "$TMP/cli.py" 10.213.2.1 5000 HOLD 0 1.5
hold=$TH_PID
for i in $(seq 1 50); do grep -q held "$TMP/hold" && break; sleep 0.1; done
grep -q held "$TMP/hold" || fail "a's held connection to c: $(cat "$TMP/hold")"
th_cut c || fail "th_cut c"
kill "${srv_pid[c]}"
put a c 5 1 >/dev/null 2>&1 && fail "a connected to c after th_cut"
put c a 5 1 >/dev/null 2>&1 && fail "c connected to a after th_cut"
wait "$hold"
[ "$(tail -n 1 "$TMP/hold")" = timeout ] || fail "a's held connection: $(tail -n 1 "$TMP/hold"), want timeout (no FIN or RST)"
th_mend c || fail "th_mend c"
srv c && echo "ok   th_cut: no FIN/RST reached a, connects failed; th_mend restored"

# th_drop 1.0 blocks b; th_undrop restores
th_drop b 1.0 || fail "th_drop"
[ "$(th_exec b iptables -S | grep -c 'statistic --mode random')" = 2 ] || fail "th_drop: not 2 rules: $(th_exec b iptables -S)"
put a b 5 1 >/dev/null 2>&1 && fail "a reached b through th_drop b 1.0"
th_undrop b
th_exec b iptables -S | grep -q statistic && fail "th_undrop left a rule"
put a b 5 >/dev/null 2>"$TMP/err" && echo "ok   th_drop 1.0 blocked b, th_undrop restored" || fail "a -> b after th_undrop: $(cat "$TMP/err")"

# th_throttle 0.1: a busy loop gets at most 30% of a CPU over 2 s
th_bg a "$TMP/busy" bash -c 'while :; do :; done'
busy=$TH_PID
th_throttle busy 0.1 "$busy" || fail "th_throttle"
cg=$(_th_cpu_root)/st-$TH_ID-busy
[ "$(cat "$cg/cpu.cfs_quota_us")" = 10000 ] || fail "quota $(cat "$cg/cpu.cfs_quota_us"), want 10000"
grep -qx "$busy" "$cg/cgroup.procs" || fail "pid $busy not in $cg"
t0=$EPOCHREALTIME c0=$(cpu_ticks "$busy")
sleep 2
t1=$EPOCHREALTIME c1=$(cpu_ticks "$busy")
share=$(awk -v c=$((c1 - c0)) -v hz="$(getconf CLK_TCK)" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", c / hz / (b - a) }')
awk -v s="$share" 'BEGIN { exit !(s <= 0.3 && s > 0) }' && echo "ok   th_throttle 0.1: the busy loop got $share of a CPU" ||
	fail "th_throttle 0.1: the busy loop got $share of a CPU (want 0 < share <= 0.3)"
th_unthrottle busy
[ -d "$cg" ] && fail "th_unthrottle left $cg"
grep -qx '[0-9]*:cpu:/' "/proc/$busy/cgroup" || fail "pid $busy not back in the root cpu cgroup: $(grep cpu: "/proc/$busy/cgroup")"
th_throttle busy 0.1 "$busy" || fail "th_throttle again" # th_down removes it

# scripts that fail midway or are killed by SIGTERM leave nothing
script='. "$1"; th_init x || exit 2; echo "$TH_ID" >"$2"
th_switch s && th_host h 10.213.9.1 s || exit 2
th_bg h /dev/null sleep 60; echo "$TH_PID" >>"$2"; th_throttle h 0.5 "$TH_PID" || exit 2'
for how in exit1 sigterm; do
	if [ $how = exit1 ]; then
		bash -c "$script; exit 1" _ "$ST_ROOT/tests/hosts_lib.sh" "$TMP/ids.$how" 2>"$TMP/err.$how"
		rc=$? want=1
	else
		bash -c "$script; touch \$2.ready; th_exec h sleep 60" _ "$ST_ROOT/tests/hosts_lib.sh" "$TMP/ids.$how" 2>"$TMP/err.$how" &
		pid=$!
		for i in $(seq 1 100); do [ -e "$TMP/ids.$how.ready" ] && break; sleep 0.05; done
		kill -TERM $pid
		wait $pid
		rc=$? want=143
	fi
	{ read -r id; read -r bgpid; } <"$TMP/ids.$how"
	[ $rc = $want ] || fail "$how: exit $rc, want $want: $(cat "$TMP/err.$how")"
	[ -n "$id" ] && [ -n "$bgpid" ] || { fail "$how: no id or pid: $(cat "$TMP/err.$how")"; continue; }
	left=$(th_leftovers "$id")
	[ -z "$left" ] || fail "$how: run $id left: $left"
	_th_alive "$bgpid" && fail "$how: its background pid $bgpid still runs"
	[ -z "$left" ] && echo "ok   $how: run $id left nothing"
done

th_down
left=$(th_leftovers)
[ -z "$left" ] && echo "ok   th_down left nothing" || fail "th_down left: $left"
_th_alive "$busy" && fail "th_down left the busy loop ($busy)"
th_down || fail "th_down a second time"
rootnet >"$TMP/root.after"
diff "$TMP/root.before" "$TMP/root.after" >"$TMP/diff" || fail "the root namespace changed: $(cat "$TMP/diff")"
finish
