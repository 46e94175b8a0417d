#!/usr/bin/env bash
# Recovery across test hosts (network namespaces: tests/hosts_lib.sh): one
# `slicetrain controller` on a host of its own and one `slicetrain agent` on
# each of 2 slices x 1 host (x 1 device, 1 thread), steps paced to PACE s
# (llama3-test, 4 x 128 tokens a device), --repair-delay 1, --backoff-window
# BACKOFF. For each fault kind of KINDS, KILLS times, one after the other,
# once the group is back on 2 slices:
#   worker: kill -9 of slice 1's worker;
#   agent:  kill -9 of slice 1's agent (its worker dies with it), started
#           again AGENT_DOWN s later, as systemd's Restart= would;
#   stop:   SIGSTOP of slice 1's worker (hung; its agent kills it);
#   cut:    slice 1's link down (a silent host), up again once the group
#           re-formed; the host's agent (--controller-grace) reconnects and
#           its old worker is stopped;
#   hang:   slice 1's compute thread stuck (the hang hook,
#           SLICETRAIN_TEST_HANG_FILE: its other threads go on), until the
#           failure is declared; its step watchdog finds it. The fault's
#           time is when the hook's line appears in the controller's output
#           (the hook blocks at the next step's start).
# Measured from outside, by the time a line appears in the controller's
# output (polled every 5 ms): detection, the fault to the controller's
# "RUNNING -> RESTARTING"; then to the first step of the group re-formed on
# 1 slice (the sum: recovery); growth, the agent's start again (agent),
# the link's mend (cut) or the end of the repair delay (worker, stop, hang)
# to the first step on 2 slices. A failure blamed on slice 0 is a failure of the bench. Then the
# run finishes its STEPS; the summary's failures and steps lost, and the
# final weights against the same run with `slicetrain launch` on one machine
# without faults (cmp of the exported safetensors). Prints the medians and
# maxima, and each fault's times. Needs root. Nothing is left behind.
#
# Usage: bench/hosts_recovery.sh [> bench/results/hosts-recovery-CPU-DATE.txt]
#   KINDS (default "worker agent"), KILLS (default 10), PACE (default 0.05),
#   AGENT_DOWN (default 3), GAP (default 1: seconds from a growth to the next
#   fault), BACKOFF (--backoff-window, default 0: none, so that faults close
#   together each cost what one costs), STEPS (default: enough for the
#   faults), SLICETRAIN (default build/slicetrain)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLICETRAIN=${SLICETRAIN:-$ROOT/build/slicetrain}
KINDS=${KINDS:-worker agent} KILLS=${KILLS:-10} PACE=${PACE:-0.05} AGENT_DOWN=${AGENT_DOWN:-3} GAP=${GAP:-1} BACKOFF=${BACKOFF:-0}
STEPS=${STEPS:-$(awk -v n="$(echo $KINDS | wc -w)" -v k="$KILLS" -v g="$GAP" -v p="$PACE" \
	'BEGIN {printf "%d", (n * k * (g + 8 + 40 * p) + 60) / p}')}
[ -x "$SLICETRAIN" ] || { echo "no slicetrain at $SLICETRAIN (make first)" >&2; exit 2; }
. "$ROOT/tests/hosts_lib.sh"
. "$ROOT/tests/hosts_run_lib.sh"
hr_standalone hosts-recovery

echo "bench/hosts_recovery.sh: KINDS='$KINDS' KILLS=$KILLS STEPS=$STEPS PACE=$PACE AGENT_DOWN=$AGENT_DOWN GAP=$GAP"
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

hr_scenario "$STEPS" "$PACE" checkpoint_period=100 && [ "$failures" = 0 ] ||
	{ echo "cannot set up the run: $(tail -3 "$TMP/ref.out")"; exit 1; }
hr_controller run --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 1 --max-failures -1 \
	--backoff-window "$BACKOFF" -- \
	"${keys[@]}" run_name=hosts
hr_agent 0 0
hr_agent_env="SLICETRAIN_TEST_HANG_FILE=$TMP/hang" hr_agent 1 0
hr_wait_steps run 20 60 || { fail "the run did not start: $(tail -3 "$TMP/run.out")"; }

step='completed step'
declare -A det=() cont=() rec=() grow=()
for kind in $KINDS; do
	for k in $(seq 1 "$KILLS"); do
		hr_wait_steps run $(($(hr_steps run) + 3)) 60 || { fail "$kind $k: no steps before the fault"; break 2; }
		off=$(size)
		pid=$(hr_worker 1 0)
		[ $kind = agent ] && pid=${hr_apid[1.0]}
		[ -n "$pid" ] || { fail "$kind $k: no process on slice 1"; break 2; }
		old=${hr_apid[1.0]}
		t0=$(now)
		case $kind in
		worker | agent) kill -9 "$pid" ;;
		stop) kill -STOP "$pid" ;;
		cut) th_cut s1h0 ;;
		hang) touch "$TMP/hang"
			h=$(after "$off" 'test hook: .* blocks' 30) || { fail "$kind $k: the hook did not block"; break 2; }
			t0=${h% *} ;;
		esac
		d=$(after "$off" 'RUNNING -> RESTARTING' 60) || { fail "$kind $k: no failure declared"; break 2; }
		rm -f "$TMP/hang"
		r=$(after "${d#* }" 're-formed in place on 1 slice' 30) || { fail "$kind $k: no re-formation"; break 2; }
		r=$(after "${r#* }" "$step" 30) || { fail "$kind $k: no step after the re-formation"; break 2; }
		grep -qE 'RUNNING -> RESTARTING.*slice 0' <(tail -c +$((off + 1)) "$TMP/run.out") &&
			fail "$kind $k: slice 0 blamed"
		case $kind in
		cut)
			th_mend s1h0
			t1=$(now) ;;
		agent)
			for i in $(seq 600); do kill -0 "$old" 2>/dev/null || break; sleep 0.05; done
			wait "$old" 2>/dev/null
			sleep "$AGENT_DOWN"
			t1=$(now)
			hr_agent_env="SLICETRAIN_TEST_HANG_FILE=$TMP/hang" hr_agent 1 0 ;;
		*) t1=$(echo "${d% *} + 1" | bc) ;; # the end of the repair delay (worker, stop, hang)
		esac
		g=$(after "${r#* }" 're-formed in place on 2 slices' 60) || { fail "$kind $k: no growth back"; break 2; }
		g=$(after "${g#* }" "$step" 30) || { fail "$kind $k: no step after the growth"; break 2; }
		det[$kind]+=" $(echo "${d% *} - $t0" | bc)"
		cont[$kind]+=" $(echo "${r% *} - ${d% *}" | bc)"
		rec[$kind]+=" $(echo "${r% *} - $t0" | bc)"
		grow[$kind]+=" $(echo "${g% *} - $t1" | bc)"
		printf '%-6s %2d: detection %.3f s, then the first step on 1 slice %.3f s (recovery %.3f s); growth %.3f s\n' \
			$kind "$k" "$(echo "${d% *} - $t0" | bc)" "$(echo "${r% *} - ${d% *}" | bc)" \
			"$(echo "${r% *} - $t0" | bc)" "$(echo "${g% *} - $t1" | bc)"
		sleep "$GAP"
	done
done
echo "the faults are done at step $(hr_steps run) of $STEPS"
hr_end_run run $(awk -v n="$STEPS" -v p="$PACE" 'BEGIN {printf "%d", n * p + 120}')
hr_same_weights hosts "$STEPS"
for kind in $KINDS; do
	hr_stats "$kind: detection (s)" ${det[$kind]:-}
	hr_stats "$kind: detection to the first step (s)" ${cont[$kind]:-}
	hr_stats "$kind: recovery, fault to first step (s)" ${rec[$kind]:-}
	hr_stats "$kind: growth (s)" ${grow[$kind]:-}
done
hr_clean
echo "$failures failure(s)"
exit $((failures > 0))
