# What the controller refuses on test hosts (tests/hosts_lib.sh), and what
# every host's ports accept. 2 slices x 1 host: the run starts on slice 0
# (--min-slices 1); then, for slice 1:
# - an agent running another build (this binary with one byte more) is
#   refused: it exits 2 saying both builds, the controller logs it;
# - an agent on a host that does not see the run directory (a mount
#   namespace with an empty tmpfs over base_output_directory) is refused:
#   it exits 2 naming the run directory;
# - the real agent joins and the group grows to 2 slices.
# While both slices train, every listening TCP port of every host (from
# each namespace's /proc/net/tcp and tcp6) listens on that host's address
# or loopback only, in its agent's --port-range (the workers' listeners and
# rank 0's coordinator), and answers neither a client without the token (a
# status request: no answer, the connection closed) nor one with a wrong
# token (`slicetrain nodes` with another token: refused); with the run's
# token, `slicetrain nodes` from a worker host shows the run. SIGTERM to
# the controller ends the run (exit 143) and nothing is left behind.
# builds: first
# load: light
# timeout: 150
. "$(dirname "$0")/../cli_lib.sh"
. "$ST_ROOT/tests/hosts_lib.sh"
. "$ST_ROOT/tests/hosts_run_lib.sh"
keys=("$ST_ROOT/configs/base.yml" model_name=llama3-test per_device_batch_size=4 max_target_length=128
	checkpoint_period=20 dcn_data_parallelism=-1 base_output_directory="$TMP/o" steps=100000 run_name=refuse)

hr_up 2 1 || { fail "cannot make the test hosts"; finish; }
export SLICETRAIN_MIN_STEP_SECONDS=0.1
hr_controller run --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 1 -- "${keys[@]}"
hr_agent 0 0 --port-range 23000-23009
hr_wait_steps run 2 30 || fail "slice 0 did not train: $(tail -3 "$TMP/run.out")"

# another build
cp "$SLICETRAIN" "$TMP/other-slicetrain" && printf 'x' >>"$TMP/other-slicetrain"
th_exec s1h0 env OMP_NUM_THREADS=1 "$TMP/other-slicetrain" agent --controller 10.213.0.1:$hr_port --slice 1 --host 0 \
	--hosts-per-slice 1 --devices 1 >"$TMP/other.out" 2>&1
status_is "another build" $? 2 "$TMP/other.out" &&
	grep -E 'refused this host: .*build [0-9a-f]{16}.*build [0-9a-f]{16}' "$TMP/other.out" ||
	fail "another build: not refused with both builds: $(tail -2 "$TMP/other.out")"

# a host without the run directory
mkdir -p "$TMP/o"
unshare -m sh -c 'mount -t tmpfs none "$1" && shift && exec "$@"' sh "$TMP/o" \
	ip netns exec "$(th_ns s1h0)" env OMP_NUM_THREADS=1 "$SLICETRAIN" agent --controller 10.213.0.1:$hr_port \
	--slice 1 --host 0 --hosts-per-slice 1 --devices 1 >"$TMP/blind.out" 2>&1
status_is "no run directory" $? 2 "$TMP/blind.out" &&
	grep -E "cannot see the run directory $TMP/o/refuse" "$TMP/blind.out" ||
	fail "no run directory: not refused naming it: $(tail -2 "$TMP/blind.out")"
grep -E 'refusing|coordinator' "$TMP/run.out" | sed 's/^/    /'
[ "$(grep -c 'refusing' "$TMP/run.out")" -ge 2 ] || fail "the controller logged fewer than 2 refusals"

hr_agent 1 0 --port-range 23010-23019
hr_wait_line run 'growing in place from 1 to 2' 30 || fail "slice 1's agent did not join"
grep -oE 'coordinator [0-9.]+:[0-9]+' "$TMP/run.out" | grep -vE 'coordinator 10\.213\.1\.10:2300[0-9]$' &&
	fail "a coordinator not on slice 0's host in its --port-range 23000-23009"
n=$(hr_steps run)
hr_wait_steps run $((n + 3)) 30 || fail "no steps on 2 slices"

# every listening port of every host, probed from slice 0's host (in parallel)
printf 'wrong token, long enough to be one' >"$TMP/wrong"
chmod 600 "$TMP/wrong"
ports=0 probes=()
for h in ctl s0h0 s1h0; do
	th_exec $h cat /proc/net/tcp /proc/net/tcp6 | /usr/bin/python3 -c '
import socket, struct, sys
for line in sys.stdin:
    f = line.split()
    if len(f) < 4 or f[3] != "0A" or ":" not in f[1]:
        continue
    a, p = f[1].split(":")
    if len(a) == 8:
        ip = socket.inet_ntoa(struct.pack("<I", int(a, 16)))
    else:
        ip = socket.inet_ntop(socket.AF_INET6, b"".join(struct.pack("<I", int(a[i:i + 8], 16)) for i in range(0, 32, 8)))
    print(ip, int(p, 16))' >"$TMP/ports.$h"
	addr=$(th_addr $h)
	while read -r la lp; do
		ports=$((ports + 1))
		[ "$la" = "$addr" ] || [ "$la" = 127.0.0.1 ] || fail "$h: port $lp listens on $la, not $addr or loopback"
		[ "$la" = 127.0.0.1 ] && continue
		case $h in
		s0h0) [ "$lp" -ge 23000 ] && [ "$lp" -le 23009 ] || fail "$h: port $lp is not in its --port-range 23000-23009" ;;
		s1h0) [ "$lp" -ge 23010 ] && [ "$lp" -le 23019 ] || fail "$h: port $lp is not in its --port-range 23010-23019" ;;
		esac
		# no token: a status request gets no answer (the connection closed, or never served)
		( th_exec s0h0 /usr/bin/python3 - "$la" "$lp" <<'PY' || fail "$h: $la:$lp answered a client without the token"
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=6)
s.sendall(b'{"type":"status"}\n')
got = b""
try:
    while True:
        b = s.recv(4096)
        if not b:
            break
        got += b
except OSError:
    pass
sys.exit(1 if b'"state"' in got or b'"slices"' in got else 0)
PY
		  # a wrong token: refused, or no answer
		  timeout 8 ip netns exec "$(th_ns s0h0)" "$SLICETRAIN" nodes --controller "$la:$lp" --token-file "$TMP/wrong" \
			>"$TMP/nodes.$lp" 2>&1 && fail "$h: $la:$lp accepted a wrong token"
		  echo "ok   $h $la:$lp: no answer without the token; wrong token: $(tail -1 "$TMP/nodes.$lp" | cut -c1-90)"
		) &
		probes+=($!)
	done <"$TMP/ports.$h"
done
wait "${probes[@]}"
[ "$ports" -ge 3 ] || fail "found $ports listening ports, want the controller's and a worker's on each host"
th_exec s1h0 "$SLICETRAIN" nodes --controller 10.213.0.1:$hr_port >"$TMP/nodes.out" 2>&1 ||
	fail "nodes from a worker host failed: $(tail -2 "$TMP/nodes.out")"
grep -qE '^1 +in group +[0-9:]+ +0 +10\.213\.2\.10 ' "$TMP/nodes.out" || fail "nodes: slice 1 not in the group at 10.213.2.10 in: $(head -5 "$TMP/nodes.out")"

kill -TERM "$hr_ctl"
hr_wait run 30
status_is "the run, stopped by SIGTERM" "$hr_rc" 143 "$TMP/run.out"
hr_clean
finish
