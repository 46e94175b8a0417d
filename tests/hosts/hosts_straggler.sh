# A slow host across test hosts (tests/hosts_lib.sh), 2 slices x 1 host,
# steps paced to 0.2 s: slice 1's workers run with the slow hook
# (SLICETRAIN_TEST_SLOW_FILE, docs/testing.md: each step's compute takes the
# seconds the file holds longer). With 0.3 s more, slice 1's compute up to
# the gradient collective is far past 1.5 x the group's median: after
# --straggler-steps (5) steps in a row the controller reports it (its log,
# a "straggler" event, `slicetrain nodes`) and, with --evict-stragglers,
# takes slice 1 out (re-formed in place on slice 0). The file removed, slice
# 1 comes back after the repair delay and the group grows back. The run
# finishes with 0 steps lost and final weights bit-identical to the same run
# with `slicetrain launch`. make test-hosts.
# builds: first
# load: light
# timeout: 150
. "$(dirname "$0")/../cli_lib.sh"
. "$ST_ROOT/tests/hosts_lib.sh"
. "$ST_ROOT/tests/hosts_run_lib.sh"
steps=100
hr_scenario $steps 0.2 || { fail "cannot make the test hosts"; finish; }
hr_controller run --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 2 --backoff-window 0 \
	--evict-stragglers -- "${keys[@]}" run_name=hosts
hr_agent 0 0
hr_agent_env="SLICETRAIN_TEST_SLOW_FILE=$TMP/slow" hr_agent 1 0
hr_wait_steps run 10 60 || fail "no steps: $(tail -3 "$TMP/run.out")"
m=$(hr_steps run)
echo 0.3 >"$TMP/slow"
hr_wait_line run 'slice 1 host 0 is slow: compute' 30 || fail "the slow host was not reported"
echo "reported after $(($(hr_steps run) - m)) steps: $(grep -o 'slice 1 host 0 is slow.*' "$TMP/run.out" | head -1 | cut -c1-150)"
th_exec ctl "$SLICETRAIN" nodes --controller "10.213.0.1:$hr_port" --token-file "$TMP/token" >"$TMP/nodes.out" 2>&1
grep -q 'host 0 is slow' "$TMP/nodes.out" && echo "nodes: $(grep 'is slow' "$TMP/nodes.out")" ||
	fail "slicetrain nodes does not show the slow host: $(cat "$TMP/nodes.out")"
hr_wait_line run 're-formed in place on 1 slice' 20 || fail "the slow slice was not taken out"
grep -q 'RUNNING -> RESTARTING.*slice 1 host 0 is slow' "$TMP/run.out" || fail "the eviction did not name the slow host"
rm -f "$TMP/slow"
hr_wait_line run 'growing in place from 1 to 2' 30 || fail "no growth back after the slow host recovered"
hr_wait run 120
status_is "hosts run" "$hr_rc" 0 "$TMP/run.out"
grep -E 'State Transition|slow' "$TMP/run.out" | cut -c1-200 | sed 's/^/    /'
hr_summary run
[ "$(hr_get steps_lost)" = 0 ] || fail "summary: steps_lost '$(hr_get steps_lost)', want 0"
grep -E 'RESTARTING.*slice 0' "$TMP/run.out" && fail "slice 0 was taken out"
hr_same_weights hosts $steps
hr_clean
finish
