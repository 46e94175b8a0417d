# Elastic launch, too many failures: --max-failures 1 with two kills (slice 1
# at step 5, then slice 0, the group's last, at step 15; --repair-delay 30 so
# slice 1 stays out): the second failure ends the run with exit status 3 and
# the summary (2 failures) on stdout and in the metrics file. Then kill -9 of
# a worker from outside (not injected) and of an agent, with --max-failures
# -1: both are failures, the run finishes (exit 0). A slice that fails again
# right after its return is kept out twice as long (back-off), unless the
# group needs it to reach --min-slices. Fewer than --min-slices healthy for
# --wait-timeout seconds: exit 3. Then SIGTERM to the launcher mid-run: exit 143. No process of any run left behind.
# timeout: 200
# load: light
. "$(dirname "$0")/../cli_lib.sh"
. "$(dirname "$0")/elastic_lib.sh"
keys=("${el_keys[@]}" steps=40)

el_start maxf --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 30 --max-failures 1 \
	--kill 1@5 --kill 0@15 -- "${keys[@]}" run_name=maxf metrics_file="$TMP/maxf.jsonl"
el_wait maxf 60
status_is "two failures with --max-failures 1" "$el_rc" 3 "$TMP/maxf.err"
grep -E 'State Transition' "$TMP/maxf.err" | sed 's/^/    /'
sum=$(el_summary maxf)
echo "summary: $(echo $sum)"
[ "$(echo "$sum" | el_get failures)" = 2 ] || fail "summary: want 2 failures"
ev=$(el_events maxf "$TMP/maxf.jsonl")
echo "events: $ev"
[[ "$ev" == "failure shrink reform failure summary" ]] || fail "events: '$ev'"
grep -q 'RESTARTING -> ERRORED' "$TMP/maxf.err" || fail "no transition to ERRORED"

# faults from outside: kill -9 of a worker, then of an agent
el_start ext --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 1 --max-failures -1 -- \
	"${keys[@]}" steps=$el_steps run_name=ext metrics_file="$TMP/ext.jsonl"
wait_steps() { el_wait_steps ext $(($(grep -c 'completed step' "$TMP/ext.out") + $1)); } # N more step lines
wait_steps 5 || fail "ext: no training"
agent=$(pgrep -P "$el_pid" -f -- '--slice 1 ' | head -1)
worker=$([ -n "$agent" ] && pgrep -P "$agent" | head -1)
[ -n "$worker" ] && kill -KILL "$worker" || fail "ext: no worker of slice 1 found"
for _ in $(seq 1 100); do grep -q 'State Transition. RUNNING -> RESIZING. (. healthy slices: growing' "$TMP/ext.err" && break; sleep 0.1; done
wait_steps 3 || fail "ext: no training after the grow"
agent=$(pgrep -P "$el_pid" -f -- '--slice 0 ' | head -1)
[ -n "$agent" ] && kill -KILL "$agent" || fail "ext: no agent of slice 0 found"
el_wait ext 90
status_is "kill -9 of a worker and of an agent" "$el_rc" 0 "$TMP/ext.err"
grep -E 'State Transition|lost' "$TMP/ext.err" | sed 's/^/    /'
sum=$(el_summary ext)
echo "summary: $(echo $sum)"
[ "$(echo "$sum" | el_get failures)" = 2 ] || fail "ext: want 2 failures"

# back-off: slice 1 killed, repaired after 1 s, killed again at once when
# back (the second fault waits until slice 1 is in the group): out 2 s
el_start back --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 1 --max-failures -1 \
	--kill 1@5 --kill 1@6 -- "${keys[@]}" steps=$el_steps run_name=back
el_wait back 90
status_is "a slice failing again after its return" "$el_rc" 0 "$TMP/back.err"
grep -E 'back-off|is down' "$TMP/back.err" | sed 's/^/    /'
grep -q 'slice 1 failed again .* back-off x2' "$TMP/back.err" || fail "back-off: no 'back-off x2' for slice 1"
grep -q 'slice 1 is down for 2.0 s' "$TMP/back.err" || fail "back-off: slice 1 not kept out twice the repair delay"
[ "$(el_summary back | el_get failures)" = 2 ] || fail "back-off: want 2 failures"

# back-off of the group's last slice: it fails again right after its return
# (out 2 s), but without it fewer than --min-slices are healthy: the group
# takes it when its repair delay is over, not when its back-off is
el_start last --num-slices 1 --min-slices 1 --devices-per-slice 1 --repair-delay 1 --max-failures -1 \
	--kill 0@5 --kill 0@6 -- "${keys[@]}" steps=12 run_name=last
el_wait last 90
status_is "the last slice failing again after its return" "$el_rc" 0 "$TMP/last.err"
grep -E 'back-off|is down|taken' "$TMP/last.err" | sed 's/^/    /'
grep -q 'slice 0 is down for 2.0 s' "$TMP/last.err" || fail "last: slice 0 not given a back-off"
grep -q 'slice 0 taken before its back-off ends' "$TMP/last.err" || fail "last: the group waited out the back-off"

# fewer than --min-slices healthy for --wait-timeout seconds: exit 3 with the summary
el_start wait --num-slices 2 --min-slices 2 --devices-per-slice 1 --wait-timeout 2 --kill 1@3:1000 -- \
	"${keys[@]}" steps=40 run_name=wait
el_wait wait 60
status_is "fewer than --min-slices for --wait-timeout" "$el_rc" 3 "$TMP/wait.err"
grep -q 'fewer than 2 healthy slices for 2 s (--wait-timeout)' "$TMP/wait.err" || fail "wait: no --wait-timeout error"
[ "$(el_summary wait | el_get failures)" = 1 ] || fail "wait: want the summary with 1 failure"
"$SLICETRAIN" launch --num-slices 2 --min-slices 1 --devices-per-slice 1 --wait-timeout 0 -- "${keys[@]}" \
	>"$TMP/w0.out" 2>&1
status_is "--wait-timeout 0" $? 2 "$TMP/w0.out"

# SIGTERM to the launcher: everything stops, exit 143
el_start int --num-slices 2 --min-slices 1 --devices-per-slice 1 -- "${keys[@]}" steps=100000 run_name=int
el_wait_steps int 1 || fail "int: no training"
kill -TERM "$el_pid"
el_wait int 30
status_is "SIGTERM to the launcher" "$el_rc" 143 "$TMP/int.err"
finish
