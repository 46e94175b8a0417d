#!/bin/bash
# Elastic goodput (issue 10): one elastic run of 2 slices x 1 device on a
# model whose step takes about 0.5 s here (llama3-test, per_device_batch_size
# 64 x 512 tokens), with a SIGKILL of a random worker from outside (by pid)
# every INTERVAL seconds. The steps are chosen from a short fault-free
# measurement so that the run lasts about DURATION seconds; it finishes by
# itself. Prints the step time on two and on one slice (the global batch is
# kept: 2 micro-batches on one), each fault's time from the kill to the next
# generation's first step (measured from outside) and the controller's
# recovery_s and growth times, steps lost, and the summary's goodput, side by
# side with Ray 2.60's figures from issue 10.
#
# Usage: bench/elastic_goodput.sh   (make goodput)
#   INTERVAL (seconds between faults, default 60), DURATION (about the run's
#   length, default 330), REPAIR (--repair-delay, default 10: a replacement
#   machine arrives), BATCH / SEQ (default 64 / 512), PERIOD
#   (checkpoint_period, default 10), SEED (default 1),
#   SLICETRAIN (the binary) or BUILD (its build directory, default build).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ST=${SLICETRAIN:-$ROOT/${BUILD:-build}/slicetrain}
[ -x "$ST" ] || { echo "no slicetrain at $ST (make first, or set SLICETRAIN / BUILD)" >&2; exit 2; }
INTERVAL=${INTERVAL:-60}
DURATION=${DURATION:-330}
REPAIR=${REPAIR:-10}
BATCH=${BATCH:-64}
SEQ=${SEQ:-512}
PERIOD=${PERIOD:-10}
SEED=${SEED:-1}
T=$(mktemp -d "${TMPDIR:-/tmp}/elastic-goodput.XXXXXX")
lpid='' ipid=''
cleanup() {
	local p
	for p in $ipid $lpid; do kill -KILL "$p" 2>/dev/null; done
	rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
keys=("$ROOT/configs/base.yml" model_name=llama3-test per_device_batch_size="$BATCH" max_target_length="$SEQ"
	dataset_type=synthetic checkpoint_period="$PERIOD" async_checkpointing=true max_num_checkpoints_to_keep=3
	dcn_data_parallelism=-1 learning_rate=1e-3 base_output_directory="$T/o")
echo "goodput: llama3-test, per_device_batch_size $BATCH x $SEQ tokens, 2 slices x 1 device, checkpoint_period $PERIOD;" \
	"a SIGKILL of a random worker every $INTERVAL s, --repair-delay $REPAIR; $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(date -u '+%F %H:%M UTC')"

# the step time on 2 slices (fault-free, 8 steps; step 0 left out)
OMP_NUM_THREADS=1 timeout 300 "$ST" launch --threads-per-device 1 --num-slices 2 --devices-per-slice 1 -- "${keys[@]}" \
	steps=8 run_name=measure metrics_file="$T/measure.jsonl" >"$T/measure.out" 2>&1 || { echo "measurement failed: $(tail -3 "$T/measure.out")"; exit 1; }
t2=$(/usr/bin/python3 -c '
import json, statistics, sys
r = [x["perf/step_time_seconds"] for x in map(json.loads, open(sys.argv[1])) if "step" in x and "event" not in x and x["step"] > 0]
print(f"{statistics.median(r):.3f}")' "$T/measure.jsonl")
steps=$(/usr/bin/python3 -c "print(int($DURATION * 0.8 / $t2))")
echo "step time on 2 slices (fault-free): $t2 s; $steps steps"

t0=$(date +%s.%N)
OMP_NUM_THREADS=1 "$ST" launch --threads-per-device 1 --num-slices 2 --min-slices 1 --devices-per-slice 1 \
	--repair-delay "$REPAIR" --max-failures -1 -- "${keys[@]}" steps="$steps" run_name=goodput \
	metrics_file="$T/goodput.jsonl" >"$T/goodput.out" 2>"$T/goodput.err" &
lpid=$!
# the injector: every INTERVAL s, SIGKILL of a random worker (argv[1]
# "train" among the agents' children, by pid); then the time until the next
# generation's first step ("generation G resumed at step N"), at most 120 s
workers() {
	local a w
	for a in $(pgrep -P "$lpid"); do
		for w in $(pgrep -P "$a"); do
			[ "$(tr '\0' '\n' <"/proc/$w/cmdline" 2>/dev/null | sed -n 2p)" = train ] && echo "$w"
		done
	done
}
resumed() { grep -c '\] generation [0-9]* resumed at step' "$T/goodput.err"; }
(
	RANDOM=$SEED
	k=0
	while kill -0 "$lpid" 2>/dev/null; do
		k=$((k + 1))
		while kill -0 "$lpid" 2>/dev/null && [ "$(echo "$(date +%s.%N) < $t0 + $k * $INTERVAL" | bc)" = 1 ]; do sleep 0.2; done
		w=($(workers))
		[ ${#w[@]} -gt 0 ] || continue
		r0=$(resumed)
		p=${w[RANDOM % ${#w[@]}]}
		kill -KILL "$p" 2>/dev/null || continue
		t=$(date +%s.%N)
		for _ in $(seq 1 12000); do
			[ "$(resumed)" -gt "$r0" ] && break
			kill -0 "$lpid" 2>/dev/null || break
			sleep 0.01
		done
		if [ "$(resumed)" -gt "$r0" ]; then dt=$(echo "$(date +%s.%N) - $t" | bc); else dt=-1; fi
		echo "$(echo "$t - $t0" | bc) $p $dt" >>"$T/faults.txt"
	done
) &
ipid=$!
for _ in $(seq 1 $((DURATION * 30))); do kill -0 "$lpid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$lpid" 2>/dev/null && { echo "the run still goes after $((DURATION * 3)) s: SIGKILL"; kill -KILL "$lpid"; }
wait "$lpid"
rc=$?
lpid=''
wait "$ipid"
ipid=''
echo "launcher exit status $rc, wall $(echo "$(date +%s.%N) - $t0" | bc | cut -c1-6) s"
/usr/bin/python3 - "$T" "$INTERVAL" <<'PY'
import json, os, re, statistics, sys
T = sys.argv[1]
recs = []
for l in open(f"{T}/goodput.jsonl"):
    try:
        recs.append(json.loads(l))
    except ValueError:
        pass  # a line cut short by a SIGKILLed worker
# a generation's step records come before its "restore" event (the
# controller writes events when a generation ends); generation 1 has none
t, pending = {1: [], 2: []}, []
for r in recs:
    if "event" in r:
        size = len(r["slices"]) if r["event"] == "restore" else 2
        t[size] += [x["perf/step_time_seconds"] for x in pending[1:]]  # the first: restore and warm-up
        pending = []
    elif "step" in r:
        pending.append(r)
summ = ([r for r in recs if r.get("event") == "summary"] or [None])[-1]
if summ is None:
    sys.exit("no summary line in the metrics file")
faults = [l.split() for l in open(f"{T}/faults.txt")] if os.path.exists(f"{T}/faults.txt") else []
grow = [float(m) for m in re.findall(r"growth: ([0-9.]+) s", open(f"{T}/goodput.err").read())]
med = lambda v: f"{statistics.median(v):.3f} s (n={len(v)})" if v else "-"
print(f"step time in the run: 2 slices {med(t[2])}, 1 slice {med(t[1])} (the global batch kept)")
print(f"faults: {len(faults)} SIGKILLs of a worker, at " + ", ".join(f"{float(f[0]):.0f} s" for f in faults))
print("kill -> first step on the smaller group (from outside): " + ", ".join(f"{float(f[2]):.2f} s" for f in faults))
print("recovery_s (detection -> first step after it): " + ", ".join(f"{x:.2f}" for x in summ["recovery_s"]))
print("growth (slice healthy -> first step on 2 slices): " + ", ".join(f"{x:.2f} s" for x in grow))
print(f"failures {summ['failures']}, resizes {summ['resizes']}, steps lost {summ['steps_lost']}, "
      f"good {summ['good_s']:.1f} s of wall {summ['wall_s']:.1f} s: goodput {summ['goodput']:.3f}")
rec = [float(f[2]) for f in faults if float(f[2]) >= 0]
print()
print(f"{'':44} {'slicetrain':>14} {'Ray 2.60 (issue 10)':>22}")
print(f"{'hard loss of a worker -> training continues':44} {max(rec) if rec else float('nan'):>12.2f} s {'about 66 s':>22}")
print(f"{'slice back -> grown':44} {max(grow) if grow else float('nan'):>12.2f} s {'about 22 s':>22}")
print(f"{'steps lost: per kill / per grow':44} {summ['steps_lost'] / max(summ['failures'], 1):>12.1f} / 0 {'since the last ckpt / same':>22}")
print(f"{'goodput, a kill every ' + str(int(float(sys.argv[2]))) + ' s':44} {summ['goodput']:>14.3f} {'n/a (66 s stall a fault)':>22}")
PY
