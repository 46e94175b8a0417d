# An elastic run across test hosts (tests/hosts_lib.sh: network
# namespaces): `slicetrain controller` on a host of its own, one `slicetrain
# agent` on each of 2 slices x 1 host, 80 steps paced to 0.1 s. Once the
# group completed step 5, the worker of slice 1 is killed (-9): the group
# re-forms in place on slice 0 and grows back in place, the returning
# worker fed by its peer. Then the agent of slice 1 is killed (-9) and
# started again 2 s later, as systemd would: the same. The run finishes
# (exit 0) with 2 failures, 4 resizes, 0 steps lost, the coordinator on
# the hosts (never the controller's), and final weights bit-identical to
# the same run with `slicetrain launch` on one machine; nothing is left
# behind (no namespace, interface or process, no probe file). The 10-kill version with recovery times:
# bench/hosts_recovery.sh; more scenarios: make test-hosts.
# builds: first
# load: light
# timeout: 150
. "$(dirname "$0")/../cli_lib.sh"
. "$ST_ROOT/tests/hosts_lib.sh"
. "$ST_ROOT/tests/hosts_run_lib.sh"
steps=80
# the reference: the same 2 slices with launch, on this machine, straight through
hr_scenario $steps 0.1 checkpoint_period=20 || { fail "cannot make the test hosts"; finish; }
export TMPDIR=$TMP
hr_controller run --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 2 -- "${keys[@]}" run_name=hosts \
	metrics_file="$TMP/hosts.jsonl"
hr_agent 0 0
hr_agent 1 0
hr_wait_steps run 5 30 || fail "the hosts' group did not reach step 5: $(tail -3 "$TMP/run.out")"

w=$(hr_worker 1 0)
[ -n "$w" ] && kill -9 "$w" && echo "killed slice 1's worker (pid $w) at step $(hr_steps run)" || fail "no worker on slice 1"
hr_wait_line run 'growing in place from 1 to 2' 30 || fail "no growth back after the worker's kill"
n=$(hr_steps run)
hr_wait_steps run $((n + 3)) 30 || fail "no steps after the growth"

kill -9 "${hr_apid[1.0]}" && echo "killed slice 1's agent (pid ${hr_apid[1.0]}) at step $(hr_steps run)"
wait "${hr_apid[1.0]}" 2>/dev/null
sleep 2
hr_agent 1 0
hr_wait run 120
status_is "hosts run" "$hr_rc" 0 "$TMP/run.out"
grep -E 'State Transition|coordinator|refus' "$TMP/run.out" | sed 's/^/    /'
hr_summary run
[ "$(hr_get failures)" = 2 ] || fail "summary: want 2 failures"
[ "$(hr_get resizes)" = 4 ] || fail "summary: want 4 resizes (a shrink and a grow, twice)"
[ "$(hr_get steps_lost)" = 0 ] || fail "summary: steps_lost '$(hr_get steps_lost)', want 0 (re-formed in place)"
[ "$(grep -c 'growing in place from 1 to 2' "$TMP/run.out")" = 2 ] || fail "want 2 growths back in place"
grep 'restored step' "$TMP/run.out" && fail "a worker read a checkpoint"
grep -q 'received from rank 0, no checkpoint read' "$TMP/run.out" ||
	fail "the returning slice was not fed by a peer"
grep -E 'coordinator 10\.213\.0\.1:' "$TMP/run.out" && fail "a coordinator on the controller's host"
grep -qE 'coordinator 10\.213\.1\.10:' "$TMP/run.out" || fail "no coordinator on slice 0's host"

hr_same_weights hosts $steps

ls -a "$TMP/o/hosts" | grep -q probe && fail "the controller's probe file is left in the run directory"
hr_clean
finish
