# The controller goes away and training goes on, across test hosts
# (tests/hosts_lib.sh), 2 slices x 1 host, steps paced to 0.2 s:
# - deposed: a newer controller epoch is claimed on the run (its file in
#   <run_dir>/controller): the controller leaves (status 3) without
#   stopping anyone; the agents keep their workers (--controller-grace);
# - the same command started again claims the next epoch (3), every agent
#   reconnects and says what it runs, and it takes over the running
#   generation without restarting anyone;
# - kill -9 of that controller mid-run: the workers keep stepping (their
#   metrics_file records go on while no controller is up); a third takes
#   over (epoch 4), and a fault it injects then (--kill) is handled as
#   usual: slice 1 replaced, the group re-forms in place and grows back;
# - that controller killed too, and then slice 1's worker: a fourth takes
#   over 1 of the 2 workers, the missing rank is a failure of slice 1, and
#   the survivor re-forms in place (the time to its first step is printed).
# An older epoch's orders are refused by the agents (tests/test_elastic_agent.c
# replays some).
# The run finishes with 0 steps lost and final weights bit-identical to the
# same run with `slicetrain launch`; nothing is left behind.
# builds: first
# load: light
# timeout: 180
. "$(dirname "$0")/../cli_lib.sh"
. "$ST_ROOT/tests/hosts_lib.sh"
. "$ST_ROOT/tests/hosts_run_lib.sh"
steps=170
hr_scenario $steps 0.2 || { fail "cannot make the test hosts"; finish; }
opts=(--num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 1 --backoff-window 0)
hr_controller first "${opts[@]}" -- "${keys[@]}" run_name=hosts metrics_file="$TMP/metrics.jsonl"
hr_agent 0 0
hr_agent 1 0
hr_wait_steps first 10 30 || fail "no steps: $(tail -3 "$TMP/first.out")"
records() { grep -c '"learning/loss"' "$TMP/metrics.jsonl" 2>/dev/null || echo 0; }

# deposed: a newer epoch claimed on the run (a controller started elsewhere)
touch "$TMP/o/hosts/controller/epoch-2"
hr_wait first 10
[ "$hr_rc" = 3 ] && grep -q 'deposed: a controller of epoch 2 started' "$TMP/first.out" ||
	fail "the deposed controller: status $hr_rc, $(tail -1 "$TMP/first.out")"
grep -q '"type":"shutdown"\|shutdown: stopping' "$TMP"/agent-*.out && fail "the deposed controller shut the agents down"
hr_controller second "${opts[@]}" -- "${keys[@]}" run_name=hosts metrics_file="$TMP/metrics.jsonl"
hr_wait_line second 'taken over: 2 of its 2 workers' 5 || fail "the second controller did not take over"
grep -q 'listening on .*, epoch 3;' "$TMP/second.out" || fail "the second controller is not epoch 3"

# killed: the workers go on without a controller
hr_wait_steps second 3 30
kill -KILL "$hr_ctl"
wait "$hr_ctl" 2>/dev/null
n0=$(records)
sleep 2
n1=$(records)
[ "$n1" -ge $((n0 + 5)) ] && echo "no controller for 2 s: the workers made $((n1 - n0)) steps" ||
	fail "the workers made $((n1 - n0)) steps in 2 s without a controller"
t0=$(date +%s.%N)
hr_controller third "${opts[@]}" --kill 1@$((n1 + 25)) -- "${keys[@]}" run_name=hosts \
	metrics_file="$TMP/metrics.jsonl"
hr_wait_line third 'taken over: 2 of its 2 workers' 5 || fail "the third controller did not take over: $(tail -3 "$TMP/third.out")"
echo "taken over $(echo "$(date +%s.%N) - $t0" | bc) s after the new controller's start"
grep -q 'listening on .*, epoch 4;' "$TMP/third.out" || fail "the third controller is not epoch 4"
hr_wait_line third 're-formed in place on 1 slice' 30 || fail "the injected kill was not handled"
hr_wait_line third 'growing in place from 1 to 2' 30 || fail "no growth back after the kill"

# a worker killed while no controller is up: the next one finds its rank
# missing, a failure of its slice; the survivor re-forms in place
hr_wait_line third 're-formed in place on 2 slices' 30
kill -KILL "$hr_ctl"
wait "$hr_ctl" 2>/dev/null
sleep 0.5
w=$(hr_worker 1 0)
[ -n "$w" ] && kill -KILL "$w" || fail "no worker on slice 1 to kill"
sleep 1
t0=$(date +%s.%N)
hr_controller fourth "${opts[@]}" -- "${keys[@]}" run_name=hosts metrics_file="$TMP/metrics.jsonl"
hr_wait_line fourth 'taken over: 1 of its 2 workers' 5 || fail "the fourth controller did not take over: $(tail -3 "$TMP/fourth.out")"
hr_wait_line fourth 're-formed in place on 1 slice' 10 || fail "the survivor did not re-form"
hr_wait_steps fourth 1 10
echo "a worker killed with no controller up: the first step on 1 slice $(echo "$(date +%s.%N) - $t0" | bc) s after the controller's start"
hr_wait_line fourth 'growing in place from 1 to 2' 30 || fail "no growth back after the worker's loss"

hr_wait fourth 120
status_is "the fourth controller" "$hr_rc" 0 "$TMP/fourth.out"
grep -E 'State Transition|taken over|epoch' "$TMP/fourth.out" | cut -c1-200 | sed 's/^/    /'
hr_summary fourth
[ "$(hr_get failures)" = 1 ] || fail "summary: want 1 failure (the worker lost while no controller was up)"
[ "$(hr_get steps_lost)" = 0 ] || fail "summary: steps_lost '$(hr_get steps_lost)', want 0"
hr_same_weights hosts $steps
hr_clean
finish
