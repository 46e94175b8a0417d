#!/usr/bin/env bash
# The controller killed, again and again, across test hosts (network
# namespaces: tests/hosts_lib.sh): one `slicetrain controller` on a host of
# its own and one `slicetrain agent` on each of 2 slices x 1 host (x 1
# device, 1 thread), steps paced to PACE s (llama3-test). KILLS times: the
# controller is killed (-9) in the middle of a step, stays down DOWN s, and
# the same command starts again with a fault to inject 5 steps on
# (`--kill 1@N`): the time from its start to its taking over the running
# generation (every agent back), steps made while no controller was up,
# and the time from its start to the injected kill's re-formation on 1
# slice (it was handled); then the group grows back. At the end: no step
# trained twice (the metrics file's step records: 0 steps lost), the last
# controller's summary, final weights against the same run with
# `slicetrain launch` without faults. Needs root. Nothing is left behind.
#
# Usage: bench/hosts_controller.sh [> bench/results/hosts-controller-CPU-DATE.txt]
#   KILLS (default 20), PACE (0.3), DOWN (1.5), STEPS (default: enough),
#   SLICETRAIN (default build/slicetrain; a copy for a long run)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLICETRAIN=${SLICETRAIN:-$ROOT/build/slicetrain}
KILLS=${KILLS:-20} PACE=${PACE:-0.3} DOWN=${DOWN:-1.5}
STEPS=${STEPS:-$(awk -v k="$KILLS" -v p="$PACE" -v d="$DOWN" 'BEGIN {printf "%d", (k * (d + 9) + 20) / p}')}
[ -x "$SLICETRAIN" ] || { echo "no slicetrain at $SLICETRAIN (make first)" >&2; exit 2; }
. "$ROOT/tests/hosts_lib.sh"
. "$ROOT/tests/hosts_run_lib.sh"
hr_standalone hosts-controller

echo "bench/hosts_controller.sh: KILLS=$KILLS STEPS=$STEPS PACE=$PACE DOWN=$DOWN"
"$ROOT/bench/cpu.sh"
echo "date: $(date -u +%F' '%T) UTC, commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"

hr_scenario "$STEPS" "$PACE" checkpoint_period=100 && [ "$failures" = 0 ] ||
	{ echo "cannot set up the run: $(tail -3 "$TMP/ref.out")"; exit 1; }
opts=(--num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 1 --backoff-window 0 --max-failures -1)
run=("${keys[@]}" run_name=hosts metrics_file="$TMP/metrics.jsonl")
records() { grep -c '"learning/loss"' "$TMP/metrics.jsonl" 2>/dev/null || echo 0; }
now() { date +%s.%N; }
hr_controller c0 "${opts[@]}" -- "${run[@]}"
hr_agent 0 0
hr_agent 1 0
hr_wait_steps c0 10 60 || { fail "the run did not start"; }
name=c0 takes=() kills=() made=()
for k in $(seq 1 "$KILLS"); do
	hr_wait_steps "$name" $(($(hr_steps "$name") + 3)) 60 || { fail "$k: no steps"; break; }
	sleep "$(awk -v p="$PACE" 'BEGIN {printf "%.3f", p / 2}')" # the middle of a step
	kill -KILL "$hr_ctl"
	wait "$hr_ctl" 2>/dev/null
	n0=$(records)
	sleep "$DOWN"
	n1=$(records)
	name=c$k
	t0=$(now)
	hr_controller "$name" "${opts[@]}" --kill "1@$((n1 + 5))" -- "${run[@]}"
	hr_wait_line "$name" 'taken over: 2 of its 2 workers' 10 || { fail "$k: no takeover: $(tail -2 "$TMP/$name.out")"; break; }
	t1=$(now)
	hr_wait_line "$name" 're-formed in place on 1 slice' 30 || { fail "$k: the injected kill was not handled"; break; }
	t2=$(now)
	hr_wait_line "$name" 're-formed in place on 2 slices' 30 || { fail "$k: no growth back"; break; }
	takes+=("$(echo "$t1 - $t0" | bc)") kills+=("$(echo "$t2 - $t0" | bc)") made+=($((n1 - n0)))
	printf 'kill %2d: %d steps while no controller was up (%.1f s); taken over %.3f s after the start, the kill at step %d handled %.3f s after it\n' \
		"$k" $((n1 - n0)) "$DOWN" "$(echo "$t1 - $t0" | bc)" $((n1 + 5)) "$(echo "$t2 - $t0" | bc)"
done
hr_wait "$name" $(awk -v n="$STEPS" -v p="$PACE" 'BEGIN {printf "%d", n * p + 120}')
[ "$hr_rc" = 0 ] || fail "the last controller's exit status $hr_rc"
hr_summary "$name" >/dev/null
echo "the last controller's summary: failures $(hr_get failures), steps lost $(hr_get steps_lost)"
/usr/bin/python3 - "$TMP/metrics.jsonl" "$STEPS" <<'PY' || fail "steps trained twice or missing"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"learning/loss"' in l]
dup = len(steps) - len(set(steps))
print(f"metrics file: {len(steps)} step records, {len(set(steps))} distinct, {dup} trained twice (steps lost)")
sys.exit(dup != 0 or len(set(steps)) != int(sys.argv[2]))
PY
hr_same_weights hosts "$STEPS"
hr_stats "taken over after the new controller's start (s)" "${takes[@]}"
hr_stats "the injected kill re-formed after the start (s)" "${kills[@]}"
hr_stats "steps while no controller was up" "${made[@]}"
hr_clean
echo "$failures failure(s)"
exit $((failures > 0))
