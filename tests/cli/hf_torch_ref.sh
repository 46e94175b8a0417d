# Hugging Face round trip against the PyTorch peer: train llama3-test for 3
# steps, export the checkpoint, and ../shared/bench/torch_llama_ref.py (which
# reads safetensors) computes on step 3's batch the loss slicetrain printed
# for step 3 (1e-5 relative). Importing the exported directory
# (load_parameters_path) and exporting again reproduces the weights bit for bit.
# builds: optimized
. "$(dirname "$0")/../cli_lib.sh"
ref="$ST_ROOT/../shared/bench/torch_llama_ref.py"
[ -f "$ref" ] || skip_dep "$ref not present (shared bench)"
need_python numpy torch
/usr/bin/python3 - "$TMP" <<'PY'
import numpy as np, sys
rng = np.random.default_rng(5)
np.save(sys.argv[1] + "/rows.npy", rng.integers(0, 256, size=(64, 33), dtype=np.int32))
PY
common=("$ST_ROOT/configs/base.yml" model_name=llama3-test max_target_length=32 per_device_batch_size=4
	learning_rate=1e-2 dataset_type=tokens dataset_path="$TMP/rows.npy" enable_data_shuffling=false
	base_output_directory="$TMP/o" async_checkpointing=false)
"$SLICETRAIN" train "${common[@]}" run_name=a steps=3 >/dev/null 2>"$TMP/err" || fail "training: $(tail -2 "$TMP/err")"
"$SLICETRAIN" export "$TMP/o/a/checkpoints/3" "$TMP/hf" >/dev/null 2>"$TMP/err" || fail "export: $(tail -2 "$TMP/err")"
# the loss of step 3 (weights after 3 updates) on its batch: rows 12..15 (no shuffling)
"$SLICETRAIN" train "${common[@]}" run_name=a steps=4 checkpoint_period=1000 save_checkpoint_on_completion=false \
	metrics_file="$TMP/m.jsonl" >/dev/null 2>"$TMP/err" || fail "step 3: $(tail -2 "$TMP/err")"
ours=$(metric_step_losses "$TMP/m.jsonl" | sed -n 's/^3 //p')
/usr/bin/python3 -c "import numpy as np, sys; np.save(sys.argv[2], np.load(sys.argv[1])[12:16])" "$TMP/rows.npy" "$TMP/batch.npy"
theirs=$(/usr/bin/python3 "$ref" --weights "$TMP/hf/model.safetensors" --tokens "$TMP/batch.npy" --eval \
	--emb 64 --layers 2 --heads 4 --kv 2 --head_dim 16 --mlp 128 --vocab 256 --seq 32 --batch 4 | sed -n 's/^loss=//p')
/usr/bin/python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); r = abs(a - b) / a
print(f'step 3 loss: slicetrain {a!r}, torch_llama_ref {b!r}, relative difference {r:.1e}'); sys.exit(r > 1e-5)" "$ours" "$theirs" \
	|| fail "losses differ"
# import, train one step with a zero learning rate and no decay, export again: the same bytes
"$SLICETRAIN" train "${common[@]}" run_name=c steps=1 learning_rate=0 adam_weight_decay=0 load_parameters_path="$TMP/hf" \
	>/dev/null 2>"$TMP/err" || fail "import: $(tail -2 "$TMP/err")"
grep -q "loaded parameters from $TMP/hf" "$TMP/err" || fail "import did not load the parameters"
"$SLICETRAIN" export "$TMP/o/c/checkpoints/1" "$TMP/hf2" >/dev/null 2>&1 || fail "second export"
[ -s "$TMP/hf/model.safetensors" ] && cmp -s "$TMP/hf/model.safetensors" "$TMP/hf2/model.safetensors" || fail "imported weights differ from the exported ones"
finish
