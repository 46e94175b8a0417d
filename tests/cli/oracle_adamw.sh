# 20 steps of AdamW with linear warmup + cosine decay (schedule of 18 steps,
# so the last two train at lr 0) and global-norm clipping at 0.25, which is
# active at nearly every step (checked from learning/grad_norm), on
# llama3-test from a token file whose 60 rows wrap around after 15 steps,
# against the float64 PyTorch oracle (tests/parity/torch_oracle.py --train):
# every step's loss within 1e-5 relative, gradient norm within 1e-4, learning
# rate within 1e-9; final weights within 1e-4 of each tensor's norm. On one
# process and on fsdp 2 x tensor 2 (the clipping norm counts replicated
# tensors once). First the oracle's own self-test (its --train against
# torch.optim.AdamW and a hand-evaluated schedule; its gradients against
# finite differences).
# builds: optimized
. "$(dirname "$0")/../cli_lib.sh"
. "$ST_ROOT/tests/mesh_lib.sh"
need_python numpy torch
/usr/bin/python3 "$ST_ROOT/tests/parity/torch_oracle.py" --selftest --threads 1 >"$TMP/selftest.out" 2>&1 ||
	fail "the oracle's self-test failed: $(grep -E '^FAIL|Error' "$TMP/selftest.out" | head -3)"
steps=20 G=4 T=32 clip=0.25
MESH_STEPS=$steps
/usr/bin/python3 -c 'import sys, numpy as np
np.save(sys.argv[1], np.random.default_rng(7).integers(0, 256, size=(60, int(sys.argv[2]) + 1)).astype("<i4"))' \
	"$TMP/rows.npy" $T || fail "cannot write the token file"
opt=(learning_rate=3e-3 warmup_steps_fraction=0.2 learning_rate_final_fraction=0.1 learning_rate_schedule_steps=18
	adam_b1=0.9 adam_b2=0.95 adam_eps=1e-8 adam_weight_decay=0.1 gradient_clipping_threshold=$clip)
common=("$ST_ROOT/configs/base.yml" model_name=llama3-test steps=$steps max_target_length=$T dataset_type=tokens
	dataset_path="$TMP/rows.npy" enable_data_shuffling=false base_output_directory="$TMP/o" checkpoint_period=1000
	async_checkpointing=false "${opt[@]}")
# the initial weights: one step at learning rate 0 leaves them as they were
MESH_STEPS=1 mesh_single init steps=1 learning_rate=0 per_device_batch_size=$G
mesh_single single per_device_batch_size=$G
mesh_launch fsdp2_tensor2 1 4 per_device_batch_size=1 ici_fsdp_parallelism=2 ici_tensor_parallelism=2
/usr/bin/python3 "$ST_ROOT/tests/parity/torch_oracle.py" --threads 1 --train $steps --batch $G \
	--weights "$TMP/hf-init/model.safetensors" --hf-config "$TMP/hf-init/config.json" --tokens "$TMP/rows.npy" \
	--out "$TMP/oracle.safetensors" --log "$TMP/oracle.jsonl" --lr 3e-3 --warmup-fraction 0.2 --final-fraction 0.1 \
	--schedule-steps 18 --b1 0.9 --b2 0.95 --eps 1e-8 --wd 0.1 --clip $clip >"$TMP/oracle.out" 2>&1 \
	|| fail "the oracle failed: $(tail -3 "$TMP/oracle.out")"
for run in single fsdp2_tensor2; do
	/usr/bin/python3 - "$TMP/oracle.jsonl" "$TMP/$run.jsonl" $run $clip $steps <<'PY' || fail "$run: steps differ from the oracle"
import json, sys
o = [json.loads(l) for l in open(sys.argv[1])]
s = [json.loads(l) for l in open(sys.argv[2])]
run, clip, n = sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
if not len(o) == len(s) == n:
    sys.exit(f"{run}: {len(o)} oracle steps and {len(s)} slicetrain steps, want {n}")
def worst(key, mine):
    rel = [abs(a[mine] - b[key]) / abs(b[key]) if b[key] else abs(a[mine]) for a, b in zip(s, o)]
    return max(rel), rel.index(max(rel))
loss, ls = worst("loss", "learning/loss")
norm, ns = worst("grad_norm", "learning/grad_norm")
lr, rs = worst("lr", "learning/current_learning_rate")
clipped = sum(r["learning/grad_norm"] > clip for r in s)
zero_lr = [r["step"] for r in s if r["learning/current_learning_rate"] == 0]
print(f"{run:<14} vs oracle: loss rel {loss:.2e} (step {ls}), grad norm rel {norm:.2e} (step {ns}), lr rel {lr:.1e}; "
      f"clipped at {clipped}/{n} steps (norm {s[0]['learning/grad_norm']:.3f} -> {s[-1]['learning/grad_norm']:.3f} > {clip}); "
      f"lr 0 at steps {zero_lr}; loss {s[0]['learning/loss']:.4f} -> {s[-1]['learning/loss']:.4f}")
ok = loss <= 1e-5 and norm <= 1e-4 and lr <= 1e-9
ok &= clipped >= n - 2 and clipped == sum(r["clipped"] for r in o)  # clipping active at (nearly) every step
ok &= zero_lr == [0, 18, 19]  # warmup starts at 0; the schedule ends after 18 steps
sys.exit(0 if ok else 1)
PY
	mesh_compare_weights "$TMP/oracle.safetensors" "$TMP/hf-$run/model.safetensors" "$run vs oracle"
done
# the weights really moved (else the comparison above proves little)
/usr/bin/python3 - "$TMP/oracle.safetensors" "$TMP/hf-init/model.safetensors" "$ST_ROOT/tests/parity" <<'PY' \
	|| fail "some weight did not move in 20 steps"
import sys
import numpy as np
sys.path.insert(0, sys.argv[3])
from torch_oracle import read_safetensors
a, b = read_safetensors(sys.argv[1])[0], read_safetensors(sys.argv[2])[0]
moved = {k: np.linalg.norm(a[k] - b[k]) / np.linalg.norm(b[k]) for k in a}
k = min(moved, key=moved.get)
print(f"least moved tensor: {k}, |w_20 - w_0| / |w_0| = {moved[k]:.2e}")
sys.exit(0 if moved[k] > 1e-3 else 1)
PY
finish
