# llama3-test on synthetic data: the loss falls below 20% of its first value
# within 300 steps, the log line is MaxText's, the metrics file has MaxText's
# keys, and two identical runs print identical lines apart from timings and
# write bit-identical losses.
. "$(dirname "$0")/../cli_lib.sh"
args=(train "$ST_ROOT/configs/base.yml" model_name=llama3-test steps=300 per_device_batch_size=4
	max_target_length=64 learning_rate=3e-3 warmup_steps_fraction=0.05 dataset_type=synthetic
	run_name=synthetic-test base_output_directory="$TMP/out" enable_checkpointing=false)
"$SLICETRAIN" "${args[@]}" metrics_file="$TMP/m1.jsonl" >"$TMP/run1" 2>"$TMP/err1" || fail "run 1 exit $?: $(tail -3 "$TMP/err1")"
"$SLICETRAIN" "${args[@]}" metrics_file="$TMP/m2.jsonl" >"$TMP/run2" 2>"$TMP/err2" || fail "run 2 exit $?: $(tail -3 "$TMP/err2")"

n=$(grep -c '^completed step: ' "$TMP/run1")
[ "$n" -eq 300 ] || fail "expected 300 step lines, got $n"
re='^completed step: [0-9]+, seconds: [0-9]+\.[0-9]{3}, TFLOP/s/device: [0-9]+\.[0-9]{3}, Tokens/s/device: [0-9]+\.[0-9]{3}, total_weights: 256, loss: [0-9]+\.[0-9]{3}$'
bad=$(grep '^completed step' "$TMP/run1" | grep -vcE "$re")
[ "$bad" -eq 0 ] || fail "$bad lines are not MaxText's format, e.g. $(grep '^completed' "$TMP/run1" | grep -vE "$re" | head -1)"

first=$(metric_losses "$TMP/m1.jsonl" | head -1)
min=$(metric_losses "$TMP/m1.jsonl" | sort -g | head -1)
echo "first loss $first, lowest $min (ln 256 = 5.545)"
[ -n "$first" ] && awk -v f="$first" 'BEGIN{exit !(f > 5.0 && f < 7.0)}' || fail "first loss $first is not near ln(256)"
awk -v f="$first" -v m="$min" 'BEGIN{exit !(m < 0.2 * f)}' || fail "loss did not fall below 20% of $first (lowest $min)"

strip() { sed -E 's/seconds: [0-9.]+, TFLOP\/s\/device: [0-9.]+, Tokens\/s\/device: [0-9.]+/T/' "$1"; }
same_losses "two identical runs" "$TMP/m1.jsonl" "$TMP/m2.jsonl" 300
cmp -s <(strip "$TMP/run1") <(strip "$TMP/run2") || fail "two identical runs differ: $(diff <(strip "$TMP/run1") <(strip "$TMP/run2") | head -4)"

# metrics file: one JSON object per step with MaxText's keys
[ "$(wc -l <"$TMP/m1.jsonl")" -eq 300 ] || fail "metrics file has $(wc -l <"$TMP/m1.jsonl") lines"
for k in learning/loss learning/total_weights perf/step_time_seconds perf/per_device_tflops_per_sec perf/per_device_tokens_per_sec '"step"'; do
	grep -q "$k" "$TMP/m1.jsonl" || fail "metrics file lacks $k"
done
head -1 "$TMP/m1.jsonl" | grep -q '"step": *0' || fail "first metrics record is not step 0"
finish
