# Elastic launch, a failure: --kill 1@5 (SIGKILL of slice 1's worker once
# the group completed step 5) on a 2-slice run of 30 steps (dcn_data -1, so
# 2 slices, then 1, then 2 again), --repair-delay 2. The run finishes (exit
# 0); the summary shows 1 failure and 2 resizes, the metrics file a failure,
# a shrink, restores and a grow; steps lost at most the checkpoint period
# (5); the final weights within 1e-4 relative (per tensor, by norm) of a
# fault-free 2-slice run of the same 30 steps, and in fact bit-identical; every trained sample index at
# its step, those from the restore on exactly once; no process left behind;
# the last checkpoint of the newest generation, the one the run directory's
# fence names (docs/checkpoints.md, "Generations").
# Three times: the DCN data axis -1, the same with 2 devices per slice
# (ici_data 2), then the DCN FSDP axis -1 (dcn_data 1); on a sanitized
# build the last only (below).
# With the DCN data axis the group re-forms in place (worker.h): the
# survivor keeps its state, 0 steps lost, and the returning slice's worker
# gets the state from its peer; no worker reads a checkpoint after the
# start. With 2 devices per slice the survivors are 2 data replicas on one
# host, which share their gradients for the all-reduce once the group has
# re-formed (st_shard_share in bound_setup; comm.h), and stop sharing when
# the other slice is back (two local groups again, joined by TCP): the
# same checks, the weights within 1e-4 but not bit for bit (on one slice
# each device sums two micro-batches before the all-reduce; on two, the
# all-reduce sums four). The DCN FSDP axis changes every shard: the group
# restarts from the newest checkpoint (at most the checkpoint period lost).
# timeout: 200
# load: light
. "$(dirname "$0")/../cli_lib.sh"
. "$(dirname "$0")/../mesh_lib.sh"
. "$(dirname "$0")/elastic_lib.sh"
steps=$el_steps

# scenario NAME in-place|restart DEVICES_PER_SLICE KEYS...: the kill run and its fault-free reference
scenario() {
	local n=$1 how=$2 dps=$3; shift 3
	local keys=("${el_keys[@]}" steps=$steps "$@")
	echo "== $n: $*"
	# the fault-free reference: the same 2 slices, straight through
	OMP_NUM_THREADS=1 "$el_ref" launch --num-slices 2 --devices-per-slice $dps -- "${keys[@]}" run_name=ref$n \
		metrics_file="$TMP/ref$n.jsonl" >"$TMP/ref$n.out" 2>&1 || fail "reference run failed: $(tail -3 "$TMP/ref$n.out")"

	SLICETRAIN_SAMPLE_LOG="$TMP/samples$n" el_start kill$n --num-slices 2 --min-slices 1 --devices-per-slice $dps \
		--repair-delay 2 --kill 1@5 -- "${keys[@]}" run_name=kill$n metrics_file="$TMP/kill$n.jsonl"
	el_wait kill$n 90
	status_is "$n: elastic run with a kill" "$el_rc" 0 "$TMP/kill$n.err"
	grep -E '^slicetrain controller: .*(State Transition|failure detected|recovery|growth|resumed)' "$TMP/kill$n.err" |
		sed 's/^/    /'
	local sum lost ev
	sum=$(el_summary kill$n)
	echo "summary: $(echo $sum)"
	[ "$(echo "$sum" | el_get failures)" = 1 ] || fail "$n: summary: want 1 failure"
	[ "$(echo "$sum" | el_get resizes)" = 2 ] || fail "$n: summary: want 2 resizes (a shrink and a grow)"
	lost=$(echo "$sum" | el_get steps_lost)
	ev=$(el_events kill$n "$TMP/kill$n.jsonl")
	echo "events: $ev"
	if [ "$how" = in-place ]; then
		[ "$lost" = 0 ] || fail "$n: summary: steps_lost '$lost', want 0 (re-formed in place)"
		[[ "$ev" == "failure shrink reform grow reform summary" ]] || fail "$n: events: '$ev'"
		[ "$(grep -c 'restored step' "$TMP/kill$n.err")" = 0 ] || fail "$n: a worker read a checkpoint"
		grep -q 'state of step [0-9]* received from rank 0, no checkpoint read: .* checksums match' "$TMP/kill$n.err" ||
			fail "$n: the returning slice was not fed by a peer"
	else
		[ -n "$lost" ] && [ "$lost" -le 5 ] || fail "$n: summary: steps_lost '$lost', want at most the checkpoint period 5"
		[[ "$ev" == "failure shrink restore grow restore summary" ]] || fail "$n: events: '$ev'"
	fi
	# the step records of the kept history: one per step, 0..steps-1, in the end
	/usr/bin/python3 - "$TMP/kill$n.jsonl" $steps <<'PY' || fail "$n: metrics: the kept history's steps are not 0..$steps-1"
import json, sys
recs = [r for r in map(json.loads, open(sys.argv[1])) if "step" in r and "event" not in r]
kept = {}
for r in recs:                       # a later record of a step replaces an earlier (rolled back) one
    kept[r["step"]] = r
print(f"metrics: {len(recs)} step records, {len(kept)} distinct steps")
sys.exit(sorted(kept) != list(range(int(sys.argv[2]))))
PY

	# the final weights against the fault-free run's
	local r
	for r in ref$n kill$n; do
		"$SLICETRAIN" export "$TMP/o/$r/checkpoints/$steps" "$TMP/hf-$r" >/dev/null 2>"$TMP/$r.export.err" ||
			fail "$r: export failed: $(tail -1 "$TMP/$r.export.err")"
	done
	# the saves carry their group's generation: the last one is of the run's
	# newest (after a re-formation in place too: the saver is made anew with
	# the new generation); the fence holds the newest generation that left a
	# slice behind (the failure's, 2, not the growth's: a growth's save in
	# flight still commits)
	/usr/bin/python3 - "$TMP/o/kill$n" $steps <<'PY' || fail "$n: the last checkpoint is not of the newest generation, or the fence is not the failure's"
import json, sys
run, step = sys.argv[1], sys.argv[2]
fence = open(f"{run}/generation").read()
m = json.load(open(f"{run}/checkpoints/{step}/manifest.json"))
names = [f["name"] for f in m["files"]]
print(f"generation fence {fence.strip()}; checkpoint {step}: generation {m.get('generation')}, files {names}")
f, g = int(fence), m.get("generation")
sys.exit(fence != f"{f}\n" or f != 2 or not isinstance(g, int) or g < 3 or
         not all(n.startswith(f"shard-g{g:06d}-") for n in names))
PY
	[ -f "$TMP/hf-kill$n/model.safetensors" ] && mesh_compare_weights "$TMP/hf-ref$n/model.safetensors" \
		"$TMP/hf-kill$n/model.safetensors" "$n: kill 1@5 vs fault-free"
	# more, with one device per slice: the same bits. Steps on one slice sum
	# their two micro-batches as the all-reduce sums two slices'
	# (src/train/train.c, sum_micro_batch), and rolled-back steps are trained
	# again from a checkpoint of the same bits
	[ "$dps" != 1 ] || cmp -s "$TMP/hf-ref$n/model.safetensors" "$TMP/hf-kill$n/model.safetensors" ||
		fail "$n: the final weights are not bit-identical to the fault-free run's"

	# every sample trained exactly once in the kept history: a rolled-back step
	# is trained again on the same samples (its lines repeat), no sample at two
	# steps (workers flush the sample log after each batch read, so a SIGKILLed
	# worker's records survive it): the samples are exactly 0..N-1.
	cat "$TMP"/samples$n.* | /usr/bin/python3 -c '
import sys
pairs = {tuple(map(int, l.split())) for l in sys.stdin}
at = {}
for st, s in pairs:
    at.setdefault(s, set()).add(st)
n, g, r = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
late = sorted(s for s in at if s >= r * g)
print(f"samples: {len(pairs)} distinct (step, sample) pairs; from step {r} on {len(late)}, want {r * g}..{n * g - 1}")
bad = [s for s, v in at.items() if v != {s // g}]
sys.exit(late != list(range(r * g, n * g)) or bool(bad) or min(at) != 0)' $steps $((2 * dps * el_batch)) 0 ||
		fail "$n: samples skipped, repeated or trained at the wrong step"
}

# On a sanitized build only the restart: the in-place scenario's sanitized
# code (launcher, controller, agents: a worker SIGKILLed, the group re-formed
# in place, the slice's return) is elastic_soak_short's worker_kill; its
# workers' checks run on the optimized build, with the same workers.
[ "$el_san" = 1 ] && echo "== data: on the optimized build (here: elastic_soak_short's worker_kill)" ||
	{ scenario data in-place 1 dcn_data_parallelism=-1
	  scenario data2 in-place 2 dcn_data_parallelism=-1 ici_data_parallelism=2; }
scenario fsdp restart 1 dcn_data_parallelism=1 dcn_fsdp_parallelism=-1
finish
