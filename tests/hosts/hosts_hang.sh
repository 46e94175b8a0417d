# A stuck compute thread across test hosts (tests/hosts_lib.sh), 2 slices x
# 1 host, steps paced to 0.3 s: slice 1's agent runs its workers with the
# hang hook (SLICETRAIN_TEST_HANG_FILE, docs/testing.md): while the file
# exists the compute thread blocks before its next step, and the process's
# other threads (the group's heartbeats) go on, so no peer sees silence.
# - a stall shorter than the step watchdog's limit (0.3 s; the limit is
#   max(--step-watchdog-ms 1000, 3 x the longest gap)): nothing is declared;
# - a hang: the worker's step watchdog finds it, the agent kills it and
#   reports it hung, slice 1 is replaced (never slice 0), the group re-forms
#   on slice 0 and grows back once the file is gone.
# The run finishes with 1 failure, 0 steps lost, and final weights
# bit-identical to the same run with `slicetrain launch`. make test-hosts.
# builds: first
# load: light
# timeout: 150
. "$(dirname "$0")/../cli_lib.sh"
. "$ST_ROOT/tests/hosts_lib.sh"
. "$ST_ROOT/tests/hosts_run_lib.sh"
steps=90
hr_scenario $steps 0.3 || { fail "cannot make the test hosts"; finish; }
hang=$TMP/hang
hr_controller run --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 1 --backoff-window 0 -- \
	"${keys[@]}" run_name=hosts
hr_agent 0 0
hr_agent_env="SLICETRAIN_TEST_HANG_FILE=$hang" hr_agent 1 0
hr_wait_steps run 20 60 || fail "no steps: $(tail -3 "$TMP/run.out")"

# a stall below the limit
touch "$hang"
sleep 0.3
rm -f "$hang"
m=$(hr_steps run)
hr_wait_steps run $((m + 5)) 30 || fail "no steps after a short stall"
grep -q 'RESTARTING' "$TMP/run.out" && fail "a 0.3 s stall was declared a failure"

# a hang
t0=$(date +%s.%N)
touch "$hang"
hr_wait_line run 'slice 1 was hung: stuck: no step progress' 20 || fail "the stuck compute thread was not reported hung"
echo "compute thread stuck: reported hung after $(echo "$(date +%s.%N) - $t0" | bc) s"
rm -f "$hang"
hr_wait_line run 'growing in place from 1 to 2' 30 || fail "no growth back after the hang"

hr_wait run 120
status_is "hosts run" "$hr_rc" 0 "$TMP/run.out"
grep -E 'State Transition|lost:|hung' "$TMP/run.out" | cut -c1-240 | sed 's/^/    /'
hr_summary run
[ "$(hr_get failures)" = 1 ] || fail "summary: want 1 failure"
[ "$(hr_get steps_lost)" = 0 ] || fail "summary: steps_lost '$(hr_get steps_lost)', want 0"
grep -E 'RESTARTING.*slice 0' "$TMP/run.out" && fail "slice 0 (the reporter's) was blamed"
hr_same_weights hosts $steps
hr_clean
finish
