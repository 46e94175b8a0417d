# Two controllers up at once, across test hosts (tests/hosts_lib.sh): the
# run's controller address is a moving one (10.213.0.9, on host "ctl" at
# first), 2 slices x 1 host, steps paced to 0.2 s.
# - controller A runs on ctl; its host's link is cut (A still runs, on the
#   wrong side of a partition) and the address moves to host "ctl2", where
#   controller B starts with the same command: B claims epoch 2;
# - the agents' hosts forget the address's old owner (what the failover's
#   gratuitous ARP does), the agents' connection to A fails (reset by ctl2,
#   or TCP_USER_TIMEOUT) and they reconnect to the address, now B's: B takes the running generation over, nobody
#   restarted; A finds the newer epoch in the run directory and leaves
#   (status 3) without an order to anyone;
# - ctl's link mended, the run finishes under B: 0 steps lost, final weights
#   bit-identical to the same run with `slicetrain launch`.
# The agents' refusal of an older epoch's orders is replayed in
# tests/test_elastic_agent.c. make test-hosts.
# builds: first
# load: light
# timeout: 180
. "$(dirname "$0")/../cli_lib.sh"
. "$ST_ROOT/tests/hosts_lib.sh"
. "$ST_ROOT/tests/hosts_run_lib.sh"
steps=120
hr_scenario $steps 0.2 || { fail "cannot make the test hosts"; finish; }
th_host ctl2 10.213.0.2 s0 || fail "cannot make ctl2"
vip=10.213.0.9
th_exec ctl ip addr add $vip/16 dev eth0 || fail "cannot give ctl the controller's address"
ctl_cmd=(env OMP_NUM_THREADS=1 "$SLICETRAIN" controller --listen "$vip:$hr_port" --num-slices 2 --min-slices 1
	--devices-per-slice 1 --repair-delay 1 --backoff-window 0 -- "${keys[@]}" run_name=hosts)
th_bg ctl "$TMP/a.out" "${ctl_cmd[@]}"
a=$TH_PID
hr_ctl=$a
hr_agent 0 0 --controller "$vip:$hr_port"
hr_agent 1 0 --controller "$vip:$hr_port"
hr_wait_steps a 10 30 || fail "no steps under A: $(tail -3 "$TMP/a.out")"

# A partitioned away; the address moves to ctl2, where B starts
th_cut ctl || fail "cannot cut ctl's link"
th_exec ctl ip addr del $vip/16 dev eth0
th_exec ctl2 ip addr add $vip/16 dev eth0 || fail "cannot give ctl2 the controller's address"
# what a failover's gratuitous ARP does: the hosts forget the address's old owner
for h in s0h0 s1h0; do th_exec $h ip neigh flush to $vip; done
t0=$(date +%s.%N)
th_bg ctl2 "$TMP/b.out" "${ctl_cmd[@]}"
b=$TH_PID
hr_ctl=$b
grep -q 'listening on .*, epoch 2;' <(sleep 1; cat "$TMP/b.out") || fail "B is not epoch 2: $(head -2 "$TMP/b.out")"
hr_wait_line b 'taken over: 2 of its 2 workers' 20 || fail "B did not take over: $(tail -3 "$TMP/b.out")"
echo "B took over $(echo "$(date +%s.%N) - $t0" | bc) s after its start"
for i in $(seq 100); do kill -0 "$a" 2>/dev/null || break; sleep 0.1; done
kill -0 "$a" 2>/dev/null && fail "A still runs 10 s after B started"
wait "$a"
rc=$?
[ $rc = 3 ] && grep -q 'deposed: a controller of epoch 2 started' "$TMP/a.out" &&
	echo "A left: $(grep -o 'deposed: .*' "$TMP/a.out" | head -1 | cut -c1-120)" ||
	fail "A: status $rc, $(tail -2 "$TMP/a.out")"
grep -q 'shutdown: stopping' "$TMP"/agent-*.out && fail "an agent was shut down"
th_mend ctl

hr_wait b 120
status_is "B" "$hr_rc" 0 "$TMP/b.out"
grep -E 'State Transition|taken over' "$TMP/b.out" | cut -c1-200 | sed 's/^/    /'
hr_summary b
[ "$(hr_get steps_lost)" = 0 ] || fail "summary: steps_lost '$(hr_get steps_lost)', want 0"
hr_same_weights hosts $steps
hr_clean
finish
