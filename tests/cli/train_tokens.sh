# Training from token files: a 2-D .npy (one sample per row) and a uint16
# llm.c .bin shard; gradient accumulation over 2 micro-batches of 2 gives the
# same losses as one batch of 4 (up to summation order).
. "$(dirname "$0")/../cli_lib.sh"
/usr/bin/python3 - "$TMP" <<'PY'
import struct, sys
d = sys.argv[1]
T1, rows = 33, 40
toks = [(r * 7 + t * 13) % 256 for r in range(rows) for t in range(T1)]
h = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d, %d), }" % (rows, T1)
h += " " * (63 - (10 + len(h)) % 64) + "\n"
with open(d + "/rows.npy", "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode())
    f.write(struct.pack("<%di" % len(toks), *toks))
hdr = [0] * 256
hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
with open(d + "/shard_000.bin", "wb") as f:
    f.write(struct.pack("<256i", *hdr)); f.write(struct.pack("<%dH" % len(toks), *toks))
PY
common=("$ST_ROOT/configs/base.yml" model_name=llama3-test steps=5 max_target_length=32 learning_rate=1e-3
	base_output_directory="$TMP/o" run_name=tok dataset_type=tokens enable_checkpointing=false)
for src in "rows.npy" "shard_*.bin"; do
	"$SLICETRAIN" train "${common[@]}" dataset_path="$TMP/$src" per_device_batch_size=4 metrics_file="$TMP/${src%%[._]*}.jsonl" \
		>"$TMP/a" 2>"$TMP/err" || fail "$src: exit $?: $(tail -2 "$TMP/err")"
	[ "$(grep -c '^completed step' "$TMP/a")" -eq 5 ] || fail "$src: 5 steps expected"
	grep -q 'total_weights: 128,' "$TMP/a" || fail "$src: total_weights should be 4 x 32"
done
"$SLICETRAIN" train "${common[@]}" dataset_path="$TMP/rows.npy" per_device_batch_size=2 gradient_accumulation_steps=2 \
	metrics_file="$TMP/acc.jsonl" >/dev/null 2>"$TMP/err" || fail "accumulation run: exit $?: $(tail -2 "$TMP/err")"
same_losses "accumulation 2x2 vs batch 4" "$TMP/rows.jsonl" "$TMP/acc.jsonl" 5 1e-6
paste <(metric_losses "$TMP/rows.jsonl") <(metric_losses "$TMP/acc.jsonl")
# the same files in file order (no shuffling) also train
"$SLICETRAIN" train "${common[@]}" dataset_path="$TMP/rows.npy" per_device_batch_size=4 enable_data_shuffling=false >/dev/null 2>"$TMP/err" \
	|| fail "enable_data_shuffling=false: exit $?"
finish
