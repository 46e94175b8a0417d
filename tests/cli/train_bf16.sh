# dtype=bfloat16 (bf16 matrix inputs, fp32 accumulation, fp32 weights and
# optimizer state): over 300 steps of llama3-test on a fixed synthetic batch
# the loss curve stays within 2% of fp32's at every step, and differs from it
# (the bf16 path really runs). On CPUs without AVX512_BF16 the products run on
# the fp32 kernels and the activations stay bf16 (bf16_kernels auto). On a
# sanitized build 60 steps (the same code, watched; the 300-step curve is
# the optimized build's check).
. "$(dirname "$0")/../cli_lib.sh"
steps=300
grep -qa __asan_init "$SLICETRAIN" && steps=60
common=("$ST_ROOT/configs/base.yml" model_name=llama3-test steps=$steps per_device_batch_size=8 max_target_length=64
	learning_rate=1e-3 dataset_type=synthetic enable_checkpointing=false base_output_directory="$TMP/o" run_name=bf)
"$SLICETRAIN" train "${common[@]}" dtype=bfloat16 metrics_file="$TMP/bf16.jsonl" >/dev/null 2>"$TMP/err" || fail "bf16 run: $(tail -2 "$TMP/err")"
"$SLICETRAIN" train "${common[@]}" dtype=float32 metrics_file="$TMP/fp32.jsonl" >/dev/null 2>&1 || fail "fp32 run failed"
/usr/bin/python3 - "$TMP/fp32.jsonl" "$TMP/bf16.jsonl" $steps <<'PY' || fail "bf16 loss curve is not within 2% of fp32's"
import json, sys
a = [json.loads(l)["learning/loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["learning/loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == int(sys.argv[3])
rel = [abs(x - y) / x for x, y in zip(a, b)]
print(f"fp32 {a[0]:.4f} -> {a[-1]:.4f}, bf16 {b[0]:.4f} -> {b[-1]:.4f}; worst relative difference {max(rel):.2e} at step {rel.index(max(rel))}")
sys.exit(0 if max(rel) <= 0.02 and a != b else 1)
PY
finish
