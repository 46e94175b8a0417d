# Elastic launch, a preemption notice before the trainer is up: slice 1's
# worker of generation 1 is slow to start (a wrapper, SLICETRAIN_WORKER_EXE,
# waits 20 s before it execs the trainer); SIGTERM to slice 1's agent then
# kills that worker by the signal's default action: it never joins the
# group, saves nothing and cannot take part in the stop. The controller
# stops the generation at once (it has no completed step, so nothing is
# lost) instead of leaving slice 0's worker waiting for its peer until the
# preemption grace (--preemption-grace 60 here); the run goes on on slice 0,
# grows back, exits 0 with 1 preemption, 0 failures and every sample index
# trained exactly once, at its step. No process left behind.
# timeout: 150
# load: light
. "$(dirname "$0")/../cli_lib.sh"
. "$(dirname "$0")/elastic_lib.sh"
steps=$el_steps
keys=("${el_keys[@]}" steps=$steps)
real=${SLICETRAIN_WORKER_EXE:-$SLICETRAIN}
mkfifo "$TMP/never"
cat >"$TMP/worker.sh" <<SH
#!/bin/bash
# generation 1's rank 1 (slice 1): the trainer starts 20 s late (a read
# that times out: no child process to leave behind when SIGTERM kills bash)
if [ "\$SLICETRAIN_GENERATION" = 1 ] && [ "\$SLICETRAIN_RANK" = 1 ]; then
	: >"$TMP/slow.started"
	read -r -t 20 _ <>"$TMP/never"
fi
exec "$real" "\$@"
SH
chmod +x "$TMP/worker.sh"
SLICETRAIN_WORKER_EXE=$TMP/worker.sh SLICETRAIN_SAMPLE_LOG="$TMP/samples" el_start ns --num-slices 2 --min-slices 1 \
	--devices-per-slice 1 --repair-delay 2 --preemption-grace 60 -- "${keys[@]}" run_name=ns metrics_file="$TMP/ns.jsonl"
for _ in $(seq 1 $((300 * el_scale))); do
	[ -e "$TMP/slow.started" ] && break
	kill -0 "$el_pid" 2>/dev/null || break
	sleep 0.1
done
agent=$(pgrep -P "$el_pid" -f -- '--slice 1 ' | head -1)
if [ -e "$TMP/slow.started" ] && [ -n "$agent" ]; then
	kill -TERM "$agent"
else
	fail "slice 1's slow worker did not start (agent '$agent')"
fi
el_wait ns 90
status_is "elastic run with a notice before the trainer is up" "$el_rc" 0 "$TMP/ns.err"
grep -E '^slicetrain (controller: .*(State Transition|stop how|resumed|notice)|agent 1/0: .*(SIGTERM|signal))' "$TMP/ns.err" |
	sed 's/^/    /'
grep -q "worker rank 1 was killed by its SIGTERM before generation 1's first step: stop how=kill" "$TMP/ns.err" ||
	fail "the controller did not stop generation 1 at once"
grep -q 'still running .* after stop how=notice' "$TMP/ns.err" && fail "generation 1 waited out the preemption grace"
sum=$(el_summary ns)
echo "summary: $(echo $sum)"
[ "$(echo "$sum" | el_get preemptions)" = 1 ] || fail "summary: want 1 preemption"
[ "$(echo "$sum" | el_get failures)" = 0 ] || fail "summary: want 0 failures"
[ "$(echo "$sum" | el_get steps_lost)" = 0 ] || fail "summary: want 0 steps lost"
el_samples_once $steps $((2 * el_batch)) ||
	fail "samples skipped, repeated or trained at the wrong step"
finish
