# Elastic launch, a preemption: --preempt 1@5 (a preemption notice to slice
# 1's agent once the group completed step 5) on a 2-slice run of 30 steps,
# --repair-delay 2. The group saves and stops (exit 143), goes on on slice 0
# and grows back: exit 0, the summary counts 1 preemption, 0 failures, 2
# resizes and 0 steps lost; every sample index 0..N-1 trained exactly once,
# at its step. While it runs, `slicetrain nodes` shows both slices (with
# the token file the launcher made and printed; refused without it; the
# file private and removed at the end). Then a
# SIGTERM to one agent (a real notice), then to one worker: each counted as
# a preemption, 0 steps lost. No process of any run left behind.
# timeout: 200
# load: light
. "$(dirname "$0")/../cli_lib.sh"
. "$(dirname "$0")/elastic_lib.sh"
steps=$el_steps
keys=("${el_keys[@]}" steps=$steps)

SLICETRAIN_SAMPLE_LOG="$TMP/samples" el_start pre --num-slices 2 --min-slices 1 --devices-per-slice 1 \
	--repair-delay 2 --preempt 1@5 -- "${keys[@]}" run_name=pre metrics_file="$TMP/pre.jsonl"
# slicetrain nodes against the running controller, once a step completed
controller_of "$TMP/pre.err" "$TMP/pre.out" "$el_pid" $((300 * el_scale))
if [ -z "$addr" ]; then
	fail "the launcher printed no controller address"
else
	# the launcher made the run's token; it prints the file's path (never the token)
	[ -n "$tokf" ] && [ "$(stat -c %a "$tokf")" = 600 ] && [ "$(stat -c %a "$(dirname "$tokf")")" = 700 ] ||
		fail "the launcher's token file '$tokf' is missing or not private"
	env -u SLICETRAIN_TOKEN_FILE -u SLICETRAIN_TOKEN timeout 10 "$SLICETRAIN" nodes --controller "$addr" \
		>"$TMP/nodes0.out" 2>&1
	status_is "slicetrain nodes without the run's token" $? 1 "$TMP/nodes0.out"
	grep -q 'refused' "$TMP/nodes0.out" || fail "nodes without the token: $(cat "$TMP/nodes0.out")"
	timeout 10 "$SLICETRAIN" nodes --controller "$addr" --token-file "$tokf" >"$TMP/nodes.out" 2>&1 ||
		fail "slicetrain nodes failed: $(cat "$TMP/nodes.out")"
	sed 's/^/    nodes: /' "$TMP/nodes.out"
	[ "$(grep -cE '^[01] +(in group|healthy)' "$TMP/nodes.out")" = 2 ] || fail "slicetrain nodes does not show 2 slices in the group"
	grep -q '^mesh: 2 slices' "$TMP/nodes.out" || fail "slicetrain nodes does not show the 2-slice mesh"
fi
el_wait pre 90
status_is "elastic run with a preemption" "$el_rc" 0 "$TMP/pre.err"
[ -n "${tokf:-}" ] && [ -e "$(dirname "$tokf")" ] && fail "the launcher left its token directory $(dirname "$tokf")"
grep -E '^slicetrain controller: .*(State Transition|growth|resumed)' "$TMP/pre.err" | sed 's/^/    /'
sum=$(el_summary pre)
echo "summary: $(echo $sum)"
[ "$(echo "$sum" | el_get preemptions)" = 1 ] || fail "summary: want 1 preemption"
[ "$(echo "$sum" | el_get failures)" = 0 ] || fail "summary: want 0 failures"
[ "$(echo "$sum" | el_get resizes)" = 2 ] || fail "summary: want 2 resizes"
[ "$(echo "$sum" | el_get steps_lost)" = 0 ] || fail "summary: want 0 steps lost"
ev=$(el_events pre "$TMP/pre.jsonl")
echo "events: $ev"
[[ "$ev" == "preemption shrink restore grow reform summary" ]] || fail "events: '$ev'"
el_samples_once $steps $((2 * el_batch)) ||
	fail "samples skipped, repeated or trained at the wrong step"

# sigterm_run NAME WHAT: a 2-slice run; once 5 steps are done, SIGTERM to
# slice 1's agent (WHAT=agent) or to its worker (WHAT=worker): one
# preemption, no failure, 0 steps lost
sigterm_run() {
	local name=$1 what=$2 agent target sum
	el_start "$name" --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 2 -- "${keys[@]}" \
		run_name="$name" metrics_file="$TMP/$name.jsonl"
	el_wait_steps "$name" 5 || fail "$name: no training"
	agent=$(pgrep -P "$el_pid" -f -- '--slice 1 ' | head -1)
	target=$agent
	[ "$what" = worker ] && target=$([ -n "$agent" ] && pgrep -P "$agent" | head -1)
	[ -n "$target" ] && kill -TERM "$target" || fail "$name: no $what of slice 1 found"
	el_wait "$name" 90
	status_is "elastic run with a SIGTERM to a $what" "$el_rc" 0 "$TMP/$name.err"
	sum=$(el_summary "$name")
	echo "summary: $(echo $sum)"
	[ "$(echo "$sum" | el_get preemptions)" = 1 ] || fail "SIGTERM to a $what: want 1 preemption"
	[ "$(echo "$sum" | el_get failures)" = 0 ] || fail "SIGTERM to a $what: want 0 failures"
	[ "$(echo "$sum" | el_get steps_lost)" = 0 ] || fail "SIGTERM to a $what: want 0 steps lost"
}
# On a sanitized build these two are elastic_soak_short's agent_term and
# worker_term (the same signals to the same processes, launcher, controller
# and agents sanitized); their checks run on the optimized build.
if [ "$el_san" = 1 ]; then
	echo "SIGTERM to an agent, to a worker: on the optimized build (here: elastic_soak_short's agent_term, worker_term)"
else
	sigterm_run term agent   # a real notice: the agent passes it on, sends "notice", exits
	sigterm_run wterm worker # from outside: the worker's exit 143
fi
finish
