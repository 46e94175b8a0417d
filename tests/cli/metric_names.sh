# Each metric's name is spelled once in src/ (src/train/metrics.c's tables,
# which every sink reads: the metrics file, TensorBoard, and the reader of
# the controller's events): every "learning/", "perf/" and "eval/" string
# literal in src/ appears exactly once. And a run's metrics file holds
# exactly those names: its step records the step metrics plus step and
# run_name, its eval records the eval metrics plus step and run_name.
# timeout: 60
# builds: first
. "$(dirname "$0")/../cli_lib.sh"
cd "$ST_ROOT" || exit 1
names=$(grep -rhoE '"(learning|perf|eval)/[a-z_]+"' src | sort)
n=$(echo "$names" | grep -c .)
[ "$n" -ge 10 ] || fail "only $n metric names found in src/"
dups=$(echo "$names" | uniq -d)
[ -z "$dups" ] || fail "metric names spelled more than once in src/: $(echo $dups)"
echo "$n metric names, each once: $(echo $names | tr -d '"')"
where=$(grep -rlE '"(learning|perf|eval)/[a-z_]+"' src)
[ "$where" = src/train/metrics.c ] || fail "metric names outside src/train/metrics.c: $where"

"$SLICETRAIN" train "$ST_ROOT/configs/base.yml" model_name=llama3-test dataset_type=synthetic steps=2 \
	per_device_batch_size=2 max_target_length=32 eval_interval=1 eval_steps=1 enable_checkpointing=false \
	base_output_directory="$TMP/o" run_name=m metrics_file="$TMP/m.jsonl" >"$TMP/out" 2>"$TMP/err"
status_is "a run with eval" $? 0 "$TMP/err"
/usr/bin/python3 - "$TMP/m.jsonl" "$names" <<'PY' || fail "the metrics file's keys are not the metric names"
import json, sys
names = {n.strip('"') for n in sys.argv[2].split()}
step = {n for n in names if not n.startswith("eval/")}
ev = {n for n in names if n.startswith("eval/")}
recs = [json.loads(l) for l in open(sys.argv[1])]
kinds = [set(r) - {"step", "run_name"} for r in recs]
print(f"{len(recs)} records: {sum(k == step for k in kinds)} step, {sum(k == ev for k in kinds)} eval")
sys.exit(not (len(recs) == 4 and all(k in (step, ev) for k in kinds) and sum(k == ev for k in kinds) == 2))
PY
finish
