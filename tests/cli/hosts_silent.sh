# Faults that are not a clean exit, across test hosts (tests/hosts_lib.sh),
# 2 slices x 1 host, steps paced to 0.2 s:
# - a silent host: slice 1's link cut (no FIN, no RST). The controller
#   finds its agent silent (--heartbeat-timeout-ms, default 1000), tells the
#   survivor to abandon the collective in flight (the agent's ST_SIG_ABORT)
#   and re-forms in place on slice 0. The link mended, the cut host's agent
#   (which kept its worker: --controller-grace) reconnects, says what it
#   runs, is told to stop that worker of the old generation, and the group
#   grows back onto it, fed by a peer;
# - a hung worker: slice 1's worker stopped (SIGSTOP). Its agent sees it
#   stopped for 1 s, kills it and reports it hung: slice 1 is replaced (never
#   the reporter's), the group re-forms on slice 0, and grows back.
# The run finishes with 2 failures, 0 steps lost, and final weights
# bit-identical to the same run with `slicetrain launch`; nothing is left
# behind. The times from each fault to the re-formation are printed (the
# figures: bench/hosts_faults.sh).
# builds: first
# load: light
# timeout: 150
. "$(dirname "$0")/../cli_lib.sh"
. "$ST_ROOT/tests/hosts_lib.sh"
. "$ST_ROOT/tests/hosts_run_lib.sh"
steps=120
hr_scenario $steps 0.2 || { fail "cannot make the test hosts"; finish; }
hr_controller run --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 1 --backoff-window 0 -- \
	"${keys[@]}" run_name=hosts
hr_agent 0 0
hr_agent 1 0
hr_wait_steps run 5 30 || fail "no steps: $(tail -3 "$TMP/run.out")"

# a silent host
t0=$(date +%s.%N)
th_cut s1h0 || fail "cannot cut slice 1's link"
hr_wait_line run 're-formed in place on 1 slice' 20 || fail "the cut host was not replaced"
echo "link cut: re-formed on slice 0 after $(echo "$(date +%s.%N) - $t0" | bc) s"
grep -q 'slice 1 host 0 (pid [0-9]*) lost: no heartbeat' "$TMP/run.out" || fail "the silent agent was not found silent"
grep -q 'the elastic controller re-forms the group' "$TMP/run.out" || fail "the survivor did not abandon its collective"
th_mend s1h0
hr_wait_line run 'slice 1 host 0 still runs 1 worker\(s\) of generation 1: stop how=kill' 30 ||
	fail "the cut host's agent did not come back, or its old worker was not stopped"
kill -0 "${hr_apid[1.0]}" 2>/dev/null || fail "the cut host's agent stopped"
hr_wait_line run 'growing in place from 1 to 2' 30 || fail "no growth back after the link came back"

# a hung worker
n=$(grep -c 'growing in place from 1 to 2' "$TMP/run.out")
m=$(hr_steps run)
hr_wait_steps run $((m + 3)) 30 || fail "no steps on 2 slices"
w=$(hr_worker 1 0)
t0=$(date +%s.%N)
[ -n "$w" ] && kill -STOP "$w" || fail "no worker on slice 1 to stop"
hr_wait_line run 'slice 1 was hung: stopped' 20 || fail "the stopped worker was not reported hung"
echo "SIGSTOP: reported hung after $(echo "$(date +%s.%N) - $t0" | bc) s"
for i in $(seq 300); do [ "$(grep -c 'growing in place from 1 to 2' "$TMP/run.out")" -gt "$n" ] && break; sleep 0.1; done
[ "$(grep -c 'growing in place from 1 to 2' "$TMP/run.out")" -gt "$n" ] || fail "no growth back after the hung worker"

hr_wait run 120
status_is "hosts run" "$hr_rc" 0 "$TMP/run.out"
grep -E 'State Transition|lost:' "$TMP/run.out" | sed 's/^/    /'
hr_summary run
[ "$(hr_get failures)" = 2 ] || fail "summary: want 2 failures"
[ "$(hr_get steps_lost)" = 0 ] || fail "summary: steps_lost '$(hr_get steps_lost)', want 0"
grep -E 'RESTARTING.*slice 0' "$TMP/run.out" && fail "slice 0 (the reporter's) was blamed"
hr_same_weights hosts $steps
hr_clean
finish
