# Helpers of the elastic launcher's tests (tests/cli/elastic_*.sh source it
# after cli_lib.sh). Run as a test itself, it checks the elastic launcher's
# argument errors (bad --kill/--preempt values, a fault naming a slice the
# run lacks, an explicit DCN axis that no group size fits, checkpointing off).
#
# el_start NAME LAUNCH_OPTIONS... -- KEYS...: `slicetrain launch` in the
#   background (1 thread per device, steps paced to el_floor s), its output
#   in $TMP/NAME.out / .err, its pid in $el_pid; a watcher records every
#   descendant (pid, start time) of the launcher while it runs.
# el_wait NAME SECONDS: wait for the launcher (SIGKILL after SECONDS, times
#   $el_scale: 2 on a sanitized build, 3 with sanitized workers, where
#   el_steps is 24 instead of 30; twice that without AVX-512); its
#   exit status in $el_rc; then no descendant may still run (else a failure).
# el_summary NAME: the summary line of the run's stdout, as KEY=VALUE lines.
# el_events NAME METRICS: the kinds of the event lines of METRICS, in order.
# el_wait_steps NAME N: wait (bounded) for N step lines of the run.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	. "$(dirname "$0")/../cli_lib.sh"
fi
# A sanitized build: the launcher, controller and agents (the elastic code
# under test) run sanitized; the workers run the optimized build beside it
# (build-X-san -> build-X) when there is one (SLICETRAIN_WORKER_EXE: the
# trainer runs sanitized in every other test, and elastic_worker.sh covers
# its elastic side), else sanitized too, several times slower: fewer steps
# (still enough for a slice to come back before the end), longer waits.
# The batch (el_batch rows of el_seq tokens per device) is the same on every
# build, and small (about 0.01 s a step): the elastic runs (el_start) are
# paced instead, every step lasting el_floor seconds
# (SLICETRAIN_MIN_STEP_SECONDS; the workers sleep the rest): the scenarios
# need steps slow enough for a slice to come back before the run ends (with
# el_steps 30 and a fault at step 5, 2 s of repair and 0.2-0.5 s to
# re-form: back near step 17, with 2-3 s to spare for a re-formation slowed
# by a loaded machine), on any CPU, without the CPU time of a batch that is
# slow by itself. The fault-free reference runs are not paced.
# el_ref: the binary of the fault-free reference runs the elastic runs are
# compared with (a baseline, not the code under test): the workers' binary,
# so that the comparison is between the same code (and a sanitized build
# does not train the reference sanitized, which took most of its time).
# el_san: 1 on a sanitized build.
el_scale=1 el_steps=30 el_batch=4 el_seq=128 el_floor=0.2 el_ref=$SLICETRAIN el_san=0
if grep -qa __asan_init "$SLICETRAIN"; then
	el_san=1
	el_opt=$(dirname "$SLICETRAIN"); el_opt=${el_opt%-san}/slicetrain
	if [ "$el_opt" != "$SLICETRAIN" ] && [ -x "$el_opt" ] && ! grep -qa __asan_init "$el_opt"; then
		export SLICETRAIN_WORKER_EXE=$el_opt
		el_ref=$el_opt
		el_scale=2
	else
		el_scale=3 el_steps=24
	fi
fi
# the waits twice as long on a CPU without AVX-512 (about half the speed;
# tests/run.sh scales the tests' time limits the same way)
grep -qw avx512f /proc/cpuinfo || el_scale=$((el_scale * ${ST_CPU_TIMEOUT_SCALE:-2}))
el_keys=("$ST_ROOT/configs/base.yml" model_name=llama3-test per_device_batch_size=$el_batch max_target_length=$el_seq
	checkpoint_period=5 dcn_data_parallelism=-1 learning_rate=1e-3 base_output_directory="$TMP/o")

el_start() {
	local name=$1; shift
	OMP_NUM_THREADS=1 SLICETRAIN_MIN_STEP_SECONDS=$el_floor "$SLICETRAIN" launch --threads-per-device 1 "$@" \
		>"$TMP/$name.out" 2>"$TMP/$name.err" &
	el_pid=$!
	/usr/bin/python3 - "$el_pid" "$TMP/$name.procs" <<'PY' &
import os, sys, time
root, out = int(sys.argv[1]), sys.argv[2]
seen = {}
def stat(p):
    try:
        s = open(f"/proc/{p}/stat").read()
    except OSError:
        return None
    f = s.rsplit(")", 1)[1].split()
    return f[0], int(f[1]), f[19]  # state, ppid, start time
while True:
    r = stat(root)
    if r is None or r[0] == "Z":
        break
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            x = stat(d)
            if x:
                procs[int(d)] = x
    kids = {}
    for p, (_, pp, _) in procs.items():
        kids.setdefault(pp, []).append(p)
    stack = [root]
    while stack:
        for k in kids.get(stack.pop(), []):
            seen.setdefault(k, procs[k][2])
            stack.append(k)
    time.sleep(0.05)
with open(out, "w") as f:
    for p, t in seen.items():
        f.write(f"{p} {t}\n")
PY
	el_watch=$!
}

el_wait() {
	local name=$1 limit=$(($2 * el_scale)) i
	for i in $(seq 1 $((limit * 10))); do
		kill -0 "$el_pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$el_pid" 2>/dev/null; then
		fail "$name: the launcher still runs after ${limit} s"
		kill -KILL "$el_pid"
	fi
	wait "$el_pid"
	el_rc=$?
	wait "$el_watch"
	local n=0 left=0 p t s
	while read -r p t; do
		n=$((n + 1))
		s=$(cat "/proc/$p/stat" 2>/dev/null) || continue
		s=${s##*) }
		set -- $s
		[ "$1" != Z ] && [ "${20}" = "$t" ] || continue
		fail "$name: process $p ($(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-80)) outlived the launcher"
		kill -KILL "$p" 2>/dev/null
		left=$((left + 1))
	done <"$TMP/$name.procs"
	echo "$name: launcher exit status $el_rc; $n descendant(s) seen, $left left behind"
}

el_summary() {
	grep '^{"event":"summary"' "$TMP/$1.out" | tail -1 | /usr/bin/python3 -c '
import json, sys
for k, v in json.loads(sys.stdin.read() or "{}").items():
    print(f"{k}={v}")'
}

el_events() {
	/usr/bin/python3 -c '
import json, sys
print(" ".join(r["event"] for r in map(json.loads, open(sys.argv[1])) if "event" in r))' "$2"
}

# el_wait_steps NAME N: until the run's stdout holds N step lines (at most 30 s; 1 if not)
el_wait_steps() {
	local i
	for i in $(seq 1 $((300 * el_scale))); do
		[ "$(grep -c 'completed step' "$TMP/$1.out")" -ge "$2" ] && return 0
		kill -0 "$el_pid" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# el_samples_once STEPS GLOBAL_BATCH: the sample logs ($TMP/samples.*) hold
# every sample index 0..STEPS*GLOBAL_BATCH-1, each trained at its step only
el_samples_once() {
	cat "$TMP"/samples.* | /usr/bin/python3 -c '
import sys
pairs = {tuple(map(int, l.split())) for l in sys.stdin}
at = {}
for st, s in pairs:
    at.setdefault(s, set()).add(st)
n, g = int(sys.argv[1]), int(sys.argv[2])
print(f"samples: {len(pairs)} distinct (step, sample) pairs, {len(at)} samples, want 0..{n * g - 1}")
sys.exit(sorted(at) != list(range(n * g)) or any(v != {s // g} for s, v in at.items()))' "$1" "$2"
}

# el_get KEY: from el_summary's output on stdin
el_get() { sed -n "s/^$1=//p"; }

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	base=(launch --num-slices 2 --min-slices 1 --devices-per-slice 1 --)
	expect_launch_error() { # name pattern -- args
		local name=$1 pattern=$2; shift 3
		"$SLICETRAIN" "$@" >"$TMP/out" 2>"$TMP/err"
		local rc=$?
		if status_is "$name" $rc 2 "$TMP/err" && ! grep -qE -- "$pattern" "$TMP/err"; then
			fail "$name: no /$pattern/ in: $(tail -2 "$TMP/err")"
		else
			echo "ok   $name: $(grep -E -- "$pattern" "$TMP/err" | head -1)"
		fi
	}
	expect_launch_error "bad --kill" "--kill needs SLICE@STEP" -- launch --num-slices 2 --kill 1x5 --devices-per-slice 1 -- "${el_keys[@]}"
	expect_launch_error "bad --preempt" "--preempt needs SLICE@STEP" -- launch --num-slices 2 --preempt 1@5:x --devices-per-slice 1 -- "${el_keys[@]}"
	expect_launch_error "fault slice" "names slice 2; the run has 2" -- launch --num-slices 2 --kill 2@5 --devices-per-slice 1 -- "${el_keys[@]}"
	expect_launch_error "explicit dcn" "dcn_data_parallelism=2 does not fit 1 slice" -- "${base[@]}" "${el_keys[@]}" dcn_data_parallelism=2
	expect_launch_error "min > num" "min-slices" -- launch --num-slices 1 --min-slices 2 --devices-per-slice 1 -- "${el_keys[@]}"
	expect_launch_error "no checkpoints" "enable_checkpointing must be true" -- "${base[@]}" "${el_keys[@]}" enable_checkpointing=false
	expect_launch_error "bad key" "no_such_key" -- "${base[@]}" "${el_keys[@]}" no_such_key=1
	finish
fi
