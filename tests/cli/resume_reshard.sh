# Resharding: a checkpoint saved on 2 slices x ici_fsdp 2 (4 processes)
# restores onto 1 process, onto ici_tensor 2, and onto 1 slice x ici_fsdp 2,
# keeping the global batch (per_device_batch_size adjusted); the first loss
# after the restore equals (1e-5 relative) the loss the saving run printed for
# that step, and training goes on. Then, on token data, a change from 4 data
# shards to 2 neither skips nor repeats a sample.
. "$(dirname "$0")/../cli_lib.sh"
common=("$ST_ROOT/configs/base.yml" model_name=llama3-test max_target_length=32 learning_rate=1e-3
	learning_rate_schedule_steps=20 base_output_directory="$TMP/o")
OMP_NUM_THREADS=1 "$SLICETRAIN" launch --num-slices 2 --devices-per-slice 2 -- "${common[@]}" run_name=save \
	dataset_type=synthetic steps=12 checkpoint_period=10 save_checkpoint_on_completion=false per_device_batch_size=1 \
	ici_fsdp_parallelism=2 dcn_data_parallelism=2 metrics_file="$TMP/save.jsonl" >"$TMP/save.out" 2>&1 \
	|| fail "saving run failed: $(tail -3 "$TMP/save.out")"
[ -f "$TMP/o/save/checkpoints/10/manifest.json" ] || fail "no committed checkpoint at step 10"
want=$(metric_step_losses "$TMP/save.jsonl" | sed -n 's/^10 //p')   # the loss of step 10

check_first() { # name metrics
	local got
	got=$(metric_step_losses "$2" | head -1 | sed -n 's/^10 //p')
	/usr/bin/python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'$1: step 10 loss {b!r} (saving run {a!r}), rel {abs(a-b)/a:.1e}'); sys.exit(abs(a-b) > 1e-5*abs(a))" "$want" "$got" \
		|| fail "$1: first loss after restore differs"
	[ "$(metric_losses "$2" | wc -l)" -eq 5 ] || fail "$1: training did not continue for 5 steps"
}
restore=(dataset_type=synthetic steps=15 load_full_state_path="$TMP/o/save/checkpoints/10" enable_checkpointing=false)
"$SLICETRAIN" train "${common[@]}" "${restore[@]}" run_name=r1 per_device_batch_size=4 metrics_file="$TMP/r1.jsonl" \
	>/dev/null 2>"$TMP/r1.err" || fail "restore onto 1 process failed: $(tail -2 "$TMP/r1.err")"
check_first "1 process" "$TMP/r1.jsonl"
OMP_NUM_THREADS=1 "$SLICETRAIN" launch --num-slices 1 --devices-per-slice 2 -- "${common[@]}" "${restore[@]}" run_name=r2 \
	per_device_batch_size=2 ici_fsdp_parallelism=1 ici_tensor_parallelism=2 metrics_file="$TMP/r2.jsonl" >"$TMP/r2.out" 2>&1 \
	|| fail "restore onto ici_tensor 2 failed: $(tail -2 "$TMP/r2.out")"
check_first "ici_tensor 2" "$TMP/r2.jsonl"
OMP_NUM_THREADS=1 "$SLICETRAIN" launch --num-slices 1 --devices-per-slice 2 -- "${common[@]}" "${restore[@]}" run_name=r3 \
	per_device_batch_size=2 ici_fsdp_parallelism=2 metrics_file="$TMP/r3.jsonl" >"$TMP/r3.out" 2>&1 \
	|| fail "restore onto 1 slice x ici_fsdp 2 failed: $(tail -2 "$TMP/r3.out")"
check_first "1 slice x ici_fsdp 2" "$TMP/r3.jsonl"

# no sample skipped or repeated: 4 data shards for 6 steps, then 2 shards for 6 more (auto-resume)
/usr/bin/python3 - "$TMP" <<'PY'
import struct, sys
T1, rows = 33, 40
toks = [(r * 7 + t * 13) % 256 for r in range(rows) for t in range(T1)]
h = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d, %d), }" % (rows, T1)
h += " " * (63 - (10 + len(h)) % 64) + "\n"
with open(sys.argv[1] + "/rows.npy", "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode())
    f.write(struct.pack("<%di" % len(toks), *toks))
PY
tok=(dataset_type=tokens dataset_path="$TMP/rows.npy" steps=12 checkpoint_period=6 run_name=shards)
SLICETRAIN_SAMPLE_LOG="$TMP/samples" OMP_NUM_THREADS=1 "$SLICETRAIN" launch --num-slices 1 --devices-per-slice 4 -- \
	"${common[@]}" "${tok[@]}" steps=6 per_device_batch_size=1 ici_fsdp_parallelism=1 ici_data_parallelism=4 \
	>"$TMP/s4.out" 2>&1 || fail "4-shard run failed: $(tail -2 "$TMP/s4.out")"
SLICETRAIN_SAMPLE_LOG="$TMP/samples" OMP_NUM_THREADS=1 "$SLICETRAIN" launch --num-slices 1 --devices-per-slice 2 -- \
	"${common[@]}" "${tok[@]}" per_device_batch_size=2 ici_fsdp_parallelism=1 ici_data_parallelism=2 \
	>"$TMP/s2.out" 2>&1 || fail "2-shard run failed: $(tail -2 "$TMP/s2.out")"
grep -q 'restored step 6' "$TMP/s2.out" || fail "the 2-shard run did not resume from step 6"
cat "$TMP"/samples.* | /usr/bin/python3 -c '
import sys
idx = sorted(int(l.split()[1]) for l in sys.stdin)
print(f"samples trained: {len(idx)} (4 shards x 6 steps + 2 shards x 6 steps, 4 per step)")
sys.exit(0 if idx == list(range(48)) else 1)' || fail "samples skipped or repeated across the change of data shards"
finish
