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
# side with Ray 2.60's figures from issue 10. Once per mode of MODES (default
# "in-place restart": the launcher's default, re-forming in place, then
# --restart-from-checkpoint), the same steps and fault times, one table.
#
# Usage: bench/elastic_goodput.sh   (make goodput)
#   MODES, INTERVAL (seconds between faults, default 60), DURATION (about the run's
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
MODES=${MODES:-in-place restart}
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
"$ROOT/bench/cpu.sh"
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

run_mode() { # MODE: one run, its report in $T/report.MODE
mode=$1
opt=()
[ "$mode" = restart ] && opt=(--restart-from-checkpoint)
rm -f "$T/faults.txt" "$T/goodput.jsonl"
echo "== $mode"
t0=$(date +%s.%N)
OMP_NUM_THREADS=1 "$ST" launch --threads-per-device 1 --num-slices 2 --min-slices 1 --devices-per-slice 1 \
	--repair-delay "$REPAIR" --max-failures -1 "${opt[@]}" -- "${keys[@]}" steps="$steps" run_name="goodput-$mode" \
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
/usr/bin/python3 - "$T" "$INTERVAL" "$mode" "$BATCH" "$SEQ" <<'PY'
import json, os, re, statistics, sys
T, mode, tokens_per_row = sys.argv[1], sys.argv[3], int(sys.argv[4]) * int(sys.argv[5])
recs = []
for l in open(f"{T}/goodput.jsonl"):
    try:
        recs.append(json.loads(l))
    except ValueError:
        pass  # a line cut short by a SIGKILLed worker
# a step's micro-batches per device (tokens/s x seconds / tokens of one
# micro-batch): 1 on 2 slices, 2 on 1 (the global batch kept); a
# generation's first step (restore, warm-up) left out
t, last = {1: [], 2: []}, None
for r in recs:
    if "event" in r:
        last = None
    elif "step" in r:
        accum = round(r["perf/per_device_tokens_per_sec"] * r["perf/step_time_seconds"] / tokens_per_row)
        if last is not None and r["step"] == last + 1 and accum in (1, 2):
            t[3 - accum].append(r["perf/step_time_seconds"])
        last = r["step"]
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
with open(f"{T}/report.{mode}", "w") as f:
    f.write(f"{max(rec) if rec else float('nan'):.2f} s\n{max(grow) if grow else float('nan'):.2f} s\n"
            f"{summ['steps_lost'] / max(summ['failures'], 1):.1f} / 0\n{summ['goodput']:.3f}\n"
            f"{med(t[2]).split(' (')[0]} / {med(t[1]).split(' (')[0]}\n")
PY
}
for m in $MODES; do
	case $m in in-place | restart) run_mode "$m" ;; *) echo "MODES: '$m' is not in-place or restart" >&2; exit 2 ;; esac
done
/usr/bin/python3 - "$T" "$INTERVAL" $MODES <<'PY'
import sys
T, modes = sys.argv[1], sys.argv[3:]
rep = {m: open(f"{T}/report.{m}").read().splitlines() for m in modes}
rows = ["hard loss of a worker -> training continues (worst)", "slice back -> grown (worst)",
        "steps lost: per kill / per grow", f"goodput, a kill every {int(float(sys.argv[2]))} s",
        "step time: 2 slices / 1 slice"]
ray = ["about 66 s", "about 22 s", "since the last ckpt / same", "n/a (66 s stall a fault)", ""]
print()
print(f"{'':52}" + "".join(f"{m:>22}" for m in modes) + f"{'Ray 2.60 (issue 10)':>28}")
for i, r in enumerate(rows):
    print(f"{r:52}" + "".join(f"{rep[m][i]:>22}" for m in modes) + f"{ray[i]:>28}")
PY
