# Preemption notices and --max-failures across test hosts (tests/hosts_lib.sh),
# 2 slices x 1 host:
# - SIGTERM to slice 1's agent (what a preemptible machine's shutdown sends):
#   the agent passes the notice to its worker, the group stops after saving
#   (a preemption, no failure), resumes on slice 0 from that save (0 steps
#   lost), and grows back when the agent is started again; the run finishes,
#   its summary says 1 preemption and 0 failures, 0 steps lost;
# - a run with --max-failures 1: slice 1's worker killed twice (-9); the
#   second failure ends the run with status 3.
# Nothing is left behind. make test-hosts.
# builds: first
# timeout: 300
. "$(dirname "$0")/../cli_lib.sh"
. "$ST_ROOT/tests/hosts_lib.sh"
. "$ST_ROOT/tests/hosts_run_lib.sh"
keys=("$ST_ROOT/configs/base.yml" model_name=llama3-test per_device_batch_size=4 max_target_length=128
	checkpoint_period=20 dcn_data_parallelism=-1 base_output_directory="$TMP/o")
hr_up 2 1 || { fail "cannot make the test hosts"; finish; }
export SLICETRAIN_MIN_STEP_SECONDS=0.1

hr_controller pre --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 1 -- "${keys[@]}" steps=150 \
	run_name=pre
hr_agent 0 0
hr_agent 1 0
hr_wait_steps pre 10 30 || fail "no steps: $(tail -3 "$TMP/pre.out")"
kill -TERM "${hr_apid[1.0]}"
wait "${hr_apid[1.0]}"
echo "slice 1's agent ended with status $? after SIGTERM"
hr_wait_line pre 'preemption notice' 30 || fail "no preemption notice in the controller's log"
n=$(hr_steps pre)
hr_wait_steps pre $((n + 5)) 30 || fail "no steps on slice 0 after the notice"
hr_agent 1 0
hr_wait_line pre 'RUNNING.*on 2 slices' 60 || true
hr_wait pre 120
status_is "preemption run" "$hr_rc" 0 "$TMP/pre.out"
grep -E 'State Transition|notice' "$TMP/pre.out" | sed 's/^/    /'
hr_summary pre
[ "$(hr_get preemptions)" = 1 ] || fail "summary: want 1 preemption"
[ "$(hr_get failures)" = 0 ] || fail "summary: want 0 failures"
[ "$(hr_get steps_lost)" = 0 ] || fail "summary: steps lost '$(hr_get steps_lost)', want 0 (saved at the notice)"
[ "$(grep -c 'on 2 slices' "$TMP/pre.out")" -ge 2 ] || fail "the group did not grow back to 2 slices"

hr_port=7401
hr_controller mf --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 1 --max-failures 1 -- \
	"${keys[@]}" steps=100000 run_name=mf
hr_agent 0 0
hr_agent 1 0
hr_wait_steps mf 5 30 || fail "max-failures run: no steps"
for k in 1 2; do
	hr_wait_line mf 'on 2 slices' 30 || fail "max-failures run: not on 2 slices before kill $k"
	w=$(hr_worker 1 0)
	[ -n "$w" ] && kill -9 "$w" || fail "no worker on slice 1 for kill $k"
	hr_wait_line mf "failures: $k|$k failure" 10 || true
	[ $k = 1 ] && { hr_wait_line mf 'growing in place from 1 to 2' 30 || fail "no growth after kill 1"; sleep 1; }
done
hr_wait mf 60
status_is "--max-failures 1, 2 failures" "$hr_rc" 3 "$TMP/mf.out"
grep -E 'State Transition' "$TMP/mf.out" | tail -2 | sed 's/^/    /'
hr_clean
finish
