# Eval (eval_interval, eval_steps, grain_eval_files; docs/observability.md):
# - exact: the eval reads the training's G samples (the first G of its own
#   file: unshuffled) and its loss after step s is the training loss of step
#   s+1, which the next step computes on the same samples with the same
#   weights (to 1e-12: training shuffles them, so only the sum's order differs;
#   1e-8 on CPUs without AVX-512, where a row's bits from oneDNN's AVX2 sgemm
#   depend on where it falls in the product (rows of a product's tail come
#   out differently: measured on a Zen 3), and training shuffles the rows);
# - MaxText's eval line and the eval/... records of the metrics file;
# - training is the same bits with eval on and off (losses and final weights),
#   on one process with gradient accumulation and on 2 processes with ZeRO-3;
# - the same eval samples on any mesh (eval losses of fsdp 2 and tensor 2
#   within rounding of one process's);
# - synthetic data evaluates a batch of its own;
# - bad eval input exits 2 with one error line.
# timeout: 240
. "$(dirname "$0")/../cli_lib.sh"
# 8 + 40 samples of 33 tokens (T = 32) as 2-D .npy files
/usr/bin/python3 - "$TMP" <<'PY'
import struct, sys
def npy(path, rows, T1, seed):
    toks = [(r * 7 + t * 13 + seed * (r + 1) * (t + 3)) % 256 for r in range(rows) for t in range(T1)]
    h = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d, %d), }" % (rows, T1)
    h += " " * (63 - (10 + len(h)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode())
        f.write(struct.pack("<%di" % len(toks), *toks))
d = sys.argv[1]
npy(d + "/g8.npy", 8, 33, 1)        # exactly one global batch of 8
npy(d + "/g12.npy", 12, 33, 1)      # the same 8 rows first, then 4 more
npy(d + "/train.npy", 40, 33, 2)
npy(d + "/eval.npy", 12, 33, 3)     # one batch of 8, 4 left over
npy(d + "/tiny.npy", 3, 33, 4)      # less than a batch
toks = [(t * 31 + 7) % 256 for t in range(2000)]  # a 1-D stream: any max_target_length
h = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % len(toks)
h += " " * (63 - (10 + len(h)) % 64) + "\n"
with open(d + "/stream.npy", "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode())
    f.write(struct.pack("<%di" % len(toks), *toks))
PY
base=("$ST_ROOT/configs/base.yml" model_name=llama3-test max_target_length=32 learning_rate=1e-3
	warmup_steps_fraction=0 base_output_directory="$TMP/o" dataset_type=tokens)

# 1. exact: training reads the 8 samples of g8 (one batch, shuffled each
# epoch), eval reads the first 8 of g12 in file order: the same 8 samples
"$SLICETRAIN" train "${base[@]}" run_name=exact steps=6 per_device_batch_size=8 enable_checkpointing=false \
	dataset_path="$TMP/g8.npy" grain_eval_files="$TMP/g12.npy" eval_steps=1 \
	eval_interval=1 metrics_file="$TMP/exact.jsonl" >"$TMP/exact.out" 2>"$TMP/exact.err" \
	|| fail "exact: exit $?: $(tail -2 "$TMP/exact.err")"
tol=1e-12
grep -qw avx512f /proc/cpuinfo || tol=1e-8
/usr/bin/python3 - "$TMP/exact.jsonl" "$tol" <<'PY' || fail "exact: eval loss is not the next step's training loss"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
train = {r["step"]: r["learning/loss"] for r in recs if "learning/loss" in r}
ev = {r["step"]: r for r in recs if "eval/avg_loss" in r}
assert sorted(train) == list(range(6)) and sorted(ev) == list(range(6)), (sorted(train), sorted(ev))
worst = 0.0
for s in range(5):
    e = ev[s]
    assert e["eval/total_weights"] == 8 * 32, e
    assert e["eval/total_loss"] / e["eval/total_weights"] == e["eval/avg_loss"], e
    worst = max(worst, abs(e["eval/avg_loss"] - train[s + 1]) / train[s + 1])
print(f"eval after step s vs training loss of step s+1, steps 0-4: worst rel diff {worst:.1e}")
sys.exit(0 if worst <= float(sys.argv[2]) else 1)
PY
# MaxText's line, after the step's own line, on every eval
grep -E '^eval metrics after step: [0-9]+, loss=[0-9]+\.[0-9]{3}, total_weights=256\.0$' "$TMP/exact.out" >"$TMP/lines"
[ "$(wc -l <"$TMP/lines")" -eq 6 ] || fail "exact: 6 eval lines expected: $(cat "$TMP/exact.out")"
grep -A1 '^completed step: 3,' "$TMP/exact.out" | grep -q '^eval metrics after step: 3, ' \
	|| fail "exact: the eval line of step 3 does not follow its step line"

# 2. eval on and off: the same training, bit for bit, on one process (2
# micro-batches of 4) and with ZeRO-3 (fsdp 2 on 2 processes)
one=("${base[@]}" steps=6 per_device_batch_size=4 gradient_accumulation_steps=2 dataset_path="$TMP/train.npy"
	grain_eval_files="$TMP/eval.npy" async_checkpointing=false)
on_off() { # NAME COMMAND...: the run with eval every 2 steps and without
	local name=$1 ev iv; shift
	for ev in on off; do
		iv=2; [ $ev = off ] && iv=-1
		"$@" run_name="${name}_$ev" eval_interval=$iv metrics_file="$TMP/${name}_$ev.jsonl" \
			>"$TMP/${name}_$ev.out" 2>&1 || fail "${name}_$ev: exit $?: $(tail -3 "$TMP/${name}_$ev.out")"
		"$SLICETRAIN" export "$TMP/o/${name}_$ev/checkpoints/6" "$TMP/hf_${name}_$ev" >/dev/null 2>&1 \
			|| fail "${name}_$ev: export"
	done
	same_losses "eval on/off, $name" "$TMP/${name}_on.jsonl" "$TMP/${name}_off.jsonl" 6
	cmp -s "$TMP/hf_${name}_on/model.safetensors" "$TMP/hf_${name}_off/model.safetensors" \
		|| fail "eval on/off, $name: different final weights"
}
on_off one "$SLICETRAIN" train "${one[@]}"
[ "$(grep -c '"eval/avg_loss"' "$TMP/one_on.jsonl")" -eq 3 ] || fail "one_on: 3 eval records expected"
grep -q 'eval every 2 steps: 1 batch of 8 rows, 8 of the 12 eval samples' "$TMP/one_on.out" \
	|| fail "one_on: the eval's extent is not logged"
on_off fsdp "$SLICETRAIN" launch --num-slices 1 --devices-per-slice 2 -- "${one[@]}" per_device_batch_size=2 \
	ici_fsdp_parallelism=2

# 3. the same eval samples on any mesh: tensor 2 (and fsdp 2 above) against one process
"$SLICETRAIN" launch --num-slices 1 --devices-per-slice 2 -- "${one[@]}" run_name=tp per_device_batch_size=2 \
	ici_fsdp_parallelism=1 ici_tensor_parallelism=2 eval_interval=2 enable_checkpointing=false \
	metrics_file="$TMP/tp.jsonl" >"$TMP/tp.out" 2>&1 || fail "tp: exit $?: $(tail -3 "$TMP/tp.out")"
/usr/bin/python3 - "$TMP/one_on.jsonl" "$TMP/fsdp_on.jsonl" "$TMP/tp.jsonl" <<'PY' || fail "eval losses differ between meshes"
import json, sys
def evals(p):
    return [(r["step"], r["eval/avg_loss"], r["eval/total_weights"]) for r in map(json.loads, open(p)) if "eval/avg_loss" in r]
ref = evals(sys.argv[1])
assert [s for s, _, _ in ref] == [1, 3, 5] and all(w == 8 * 32 for _, _, w in ref), ref
for p in sys.argv[2:]:
    e = evals(p)
    assert [(s, w) for s, _, w in e] == [(s, w) for s, _, w in ref], (p, e)
    worst = max(abs(a - b) / b for (_, a, _), (_, b, _) in zip(e, ref))
    print(f"{p.rsplit('/', 1)[1]}: eval losses within {worst:.1e} of one process's")
    assert worst <= 1e-5, worst
PY

# 4. synthetic data: the eval batch is not the training batch (the model memorizes the latter)
"$SLICETRAIN" train "${base[@]}" run_name=syn dataset_type=synthetic steps=8 per_device_batch_size=4 \
	enable_checkpointing=false eval_interval=4 eval_steps=2 metrics_file="$TMP/syn.jsonl" >"$TMP/syn.out" 2>&1 \
	|| fail "synthetic: exit $?: $(tail -2 "$TMP/syn.out")"
/usr/bin/python3 - "$TMP/syn.jsonl" <<'PY' || fail "synthetic eval looks like the training batch"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
train = {r["step"]: r["learning/loss"] for r in recs if "learning/loss" in r}
ev = {r["step"]: r for r in recs if "eval/avg_loss" in r}
assert sorted(ev) == [3, 7] and ev[3]["eval/total_weights"] == 2 * 4 * 32, ev
print(f"synthetic: train loss {train[7]:.3f} after 8 steps, eval {ev[7]['eval/avg_loss']:.3f}")
assert ev[7]["eval/avg_loss"] > train[7] + 0.1
PY

# 5. bad input: exit 2, one error line, no step trained
expect_error "eval without eval data" "eval_interval 2 with dataset_type tokens needs grain_eval_files" -- \
	train "${base[@]}" run_name=bad dataset_path="$TMP/train.npy" eval_interval=2
expect_error "eval data missing" "grain_eval_files '.*nothing\*\.bin' matches no file" -- \
	train "${base[@]}" run_name=bad dataset_path="$TMP/train.npy" eval_interval=2 grain_eval_files="$TMP/nothing*.bin"
expect_error "eval data smaller than a batch" "3 eval samples .* fewer than one eval batch of 8" -- \
	train "${base[@]}" run_name=bad dataset_path="$TMP/train.npy" eval_interval=2 grain_eval_files="$TMP/tiny.npy" \
	per_device_batch_size=8
expect_error "eval data of another length" "rows of 33 tokens; expected max_target_length\+1 = 17" -- \
	train "${base[@]}" run_name=bad dataset_path="$TMP/stream.npy" eval_interval=2 grain_eval_files="$TMP/eval.npy" \
	max_target_length=16
expect_error "eval_interval not a number" "eval_interval" -- train "${base[@]}" eval_interval=often
# eval_steps > 0 reads a small eval set more than once (a warning), and trains
"$SLICETRAIN" train "${base[@]}" run_name=small dataset_path="$TMP/train.npy" eval_interval=2 eval_steps=2 \
	grain_eval_files="$TMP/tiny.npy" per_device_batch_size=2 steps=2 enable_checkpointing=false >"$TMP/small.out" 2>&1 \
	|| fail "small eval set with eval_steps: exit $?: $(tail -2 "$TMP/small.out")"
grep -q 'warning: eval every 2 steps: eval_steps 2 x 2 rows is more than the 3 eval samples' "$TMP/small.out" \
	|| fail "small eval set: no warning"
finish
