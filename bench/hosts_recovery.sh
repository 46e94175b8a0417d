#!/usr/bin/env bash
# Recovery across test hosts (network namespaces: tests/hosts_lib.sh): one
# `slicetrain controller` on a host of its own and one `slicetrain agent` on
# each of 2 slices x 1 host (x 1 device), steps paced to PACE s (llama3-test,
# 4 x 128 tokens a device), --repair-delay 1. KILLS times each, one after
# the other, once the group is back on 2 slices:
#   worker: kill -9 of slice 1's worker;
#   agent:  kill -9 of slice 1's agent (its worker dies with it), started
#           again AGENT_DOWN s later, as systemd's Restart= would.
# Measured from outside, by the time a line appears in the controller's
# output (polled every 5 ms): recovery, the kill to the first step of the
# group re-formed on 1 slice; growth, the agent's start again (agent) or the
# end of the repair delay (worker) to the first step on 2 slices. Then the
# run finishes its STEPS; the summary's failures and steps lost, and the
# final weights against the same run with `slicetrain launch` on one
# machine without faults (cmp of the exported safetensors). Prints the
# medians and maxima; the raw times too. Needs root. Nothing is left behind
# (th_down, then th_leftovers is checked).
#
# Usage: bench/hosts_recovery.sh [> bench/results/hosts-recovery-CPU-DATE.txt]
#   KILLS (default 10), STEPS (default: the kills and gaps fit in them, 15400),
#   PACE (default 0.05), AGENT_DOWN (default 3), GAP (default 31: seconds
#   from a growth to the next kill; a slice that fails within 30 s of its
#   return is kept out longer, the controller's back-off for flapping
#   slices, which this bench does not measure), SLICETRAIN (default
#   build/slicetrain)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLICETRAIN=${SLICETRAIN:-$ROOT/build/slicetrain}
KILLS=${KILLS:-10} PACE=${PACE:-0.05} AGENT_DOWN=${AGENT_DOWN:-3} GAP=${GAP:-31}
STEPS=${STEPS:-$(awk -v k="$KILLS" -v g="$GAP" -v p="$PACE" 'BEGIN {printf "%d", (2 * k * (g + 7) + 60) / p}')}
[ -x "$SLICETRAIN" ] || { echo "no slicetrain at $SLICETRAIN (make first)" >&2; exit 2; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/hosts-recovery.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
. "$ROOT/tests/hosts_lib.sh"
. "$ROOT/tests/hosts_run_lib.sh"

echo "bench/hosts_recovery.sh: KILLS=$KILLS STEPS=$STEPS PACE=$PACE AGENT_DOWN=$AGENT_DOWN GAP=$GAP"
"$ROOT/bench/cpu.sh"
echo "date: $(date -u +%F' '%T) UTC, commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"

# after OFFSET PATTERN [TIMEOUT]: "TIME OFFSET2" for the first line of the
# controller's output past byte OFFSET that matches PATTERN (a Python
# regular expression): the time it was seen, and the offset past it
after() {
	/usr/bin/python3 - "$TMP/run.out" "$1" "$2" "${3:-60}" <<'PY'
import re, sys, time
path, off, pat, limit = sys.argv[1], int(sys.argv[2]), re.compile(sys.argv[3]), float(sys.argv[4])
end = time.time() + limit
buf = b""
with open(path, "rb") as f:
    f.seek(off)
    while time.time() < end:
        chunk = f.read()
        if chunk:
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                off += len(line) + 1
                if pat.search(line.decode(errors="replace")):
                    print(f"{time.time():.4f} {off}")
                    sys.exit(0)
        else:
            time.sleep(0.005)
sys.exit(1)
PY
}
size() { stat -c %s "$TMP/run.out"; }
now() { date +%s.%N; }

keys=("$ROOT/configs/base.yml" model_name=llama3-test per_device_batch_size=4 max_target_length=128
	checkpoint_period=100 dcn_data_parallelism=-1 learning_rate=1e-3 base_output_directory="$TMP/o" steps=$STEPS)
OMP_NUM_THREADS=1 "$SLICETRAIN" launch --num-slices 2 --devices-per-slice 1 -- "${keys[@]}" run_name=ref \
	>"$TMP/ref.out" 2>&1 || { echo "the reference run failed: $(tail -3 "$TMP/ref.out")"; exit 1; }

hr_up 2 1 || { echo "cannot make the test hosts"; exit 1; }
export SLICETRAIN_MIN_STEP_SECONDS=$PACE
hr_controller run --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 1 --max-failures -1 -- \
	"${keys[@]}" run_name=hosts
hr_agent 0 0
hr_agent 1 0
hr_wait_steps run 20 60 || { fail "the run did not start: $(tail -3 "$TMP/run.out")"; }

step='completed step'
declare -a rec_worker=() grow_worker=() rec_agent=() grow_agent=()
for kind in worker agent; do
	for k in $(seq 1 "$KILLS"); do
		off=$(size)
		hr_wait_steps run $(($(hr_steps run) + 3)) 30 || { fail "$kind $k: no steps before the kill"; break 2; }
		off=$(size)
		if [ $kind = worker ]; then
			pid=$(hr_worker 1 0)
			[ -n "$pid" ] || { fail "$kind $k: no worker on slice 1"; break 2; }
		else
			pid=${hr_apid[1.0]}
		fi
		t0=$(now)
		kill -9 "$pid"
		r=$(after "$off" 're-formed in place on 1 slice' 30) || { fail "$kind $k: no re-formation"; break 2; }
		r=$(after "${r#* }" "$step" 30) || { fail "$kind $k: no step after the re-formation"; break 2; }
		rec=$(echo "${r% *} - $t0" | bc)
		if [ $kind = agent ]; then
			wait "$pid" 2>/dev/null
			sleep "$AGENT_DOWN"
			t1=$(now)
			hr_agent 1 0
		else
			t1=$(echo "$t0 + 1" | bc) # the end of the repair delay
		fi
		g=$(after "${r#* }" 're-formed in place on 2 slices' 30) || { fail "$kind $k: no growth back"; break 2; }
		g=$(after "${g#* }" "$step" 30) || { fail "$kind $k: no step after the growth"; break 2; }
		grow=$(echo "${g% *} - $t1" | bc)
		printf '%-6s kill %2d: recovery %.3f s, growth %.3f s\n' $kind "$k" "$rec" "$grow"
		if [ $kind = worker ]; then rec_worker+=("$rec") grow_worker+=("$grow"); else rec_agent+=("$rec") grow_agent+=("$grow"); fi
		sleep "$GAP"
	done
done
echo "the kills are done at step $(hr_steps run) of $STEPS"
hr_wait run $(awk -v n="$STEPS" -v p="$PACE" 'BEGIN {printf "%d", n * p + 120}')
[ "$hr_rc" = 0 ] || fail "the controller's exit status $hr_rc"
sum=$(hr_summary run)
get() { echo "$sum" | sed -n "s/^$1=//p"; }
echo "summary: failures $(get failures), resizes $(get resizes), steps lost $(get steps_lost), goodput $(get goodput)"
[ "$(get steps_lost)" = 0 ] || fail "steps lost: $(get steps_lost)"
for r in ref hosts; do
	"$SLICETRAIN" export "$TMP/o/$r/checkpoints/$STEPS" "$TMP/hf-$r" >/dev/null 2>&1 || fail "$r: export failed"
done
cmp -s "$TMP/hf-ref/model.safetensors" "$TMP/hf-hosts/model.safetensors" &&
	echo "final weights: bit-identical to the fault-free run with launch on one machine" ||
	fail "final weights differ from the fault-free run's"
stats() { # NAME VALUES...: median and maximum
	local name=$1; shift
	[ $# -gt 0 ] || { echo "$name: none"; return; }
	printf '%s\n' "$@" | sort -g | awk -v n="$name" '{v[NR]=$1} END {m = NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2;
		printf "%-40s median %.3f s, max %.3f s (%d)\n", n, m, v[NR], NR}'
}
stats "worker kill -9: recovery" "${rec_worker[@]}"
stats "worker kill -9: growth after the repair" "${grow_worker[@]}"
stats "agent kill -9: recovery" "${rec_agent[@]}"
stats "agent kill -9: growth after the agent's start" "${grow_agent[@]}"
th_down
left=$(th_leftovers)
[ -z "$left" ] || fail "left behind: $left"
echo "$failures failure(s)"
exit $((failures > 0))
