# `slicetrain plan` counts the buffers a run really allocates: its activation
# and FSDP buffer bytes equal the bytes the trainer reports after allocating
# them, for fp32 and bf16 under ici_fsdp=2 (ZeRO-3 buffers, weights converted
# per product; the embedding sharded or gathered) and ici_tensor=2
# (partial-sum buffers), remat none and full; bf16 with the all-bf16 kernel
# plan and the all-fp32 one (its fp32 operand copies, bf16_kernels).
. "$(dirname "$0")/../cli_lib.sh"
common=("$ST_ROOT/configs/base.yml" model_name=llama3-test steps=1 per_device_batch_size=2 max_target_length=48
	dataset_type=synthetic enable_checkpointing=false base_output_directory="$TMP/o")
no_bf16=() # the bfloat16 cases that ran in float32 (no AVX512_BF16 here)
field() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
# llama3-test has a vocabulary of 256: at max_target_length 48 the fsdp group's
# 2 x 96 tokens are fewer, so the embedding stays sharded; at 160 it is gathered
for mesh in ici_fsdp_parallelism=2 ici_tensor_parallelism=2 "ici_fsdp_parallelism=2 max_target_length=160"; do
	for dk in float32:bf16 bfloat16:bf16 bfloat16:fp32; do
		dtype=${dk%:*} kernels=${dk#*:}
		for remat in none full; do
			name="$mesh $dtype $remat"
			[ "$dtype" = bfloat16 ] && name="$name bf16_kernels=$kernels"
			args=("${common[@]}" $mesh dtype=$dtype bf16_kernels=$kernels remat_policy=$remat run_name=pm)
			"$SLICETRAIN" plan "${args[@]}" --devices-per-slice 2 --json >"$TMP/plan.json" 2>/dev/null ||
				{ fail "$name: plan failed"; continue; }
			if ! "$SLICETRAIN" launch --num-slices 1 --devices-per-slice 2 -- "${args[@]}" >"$TMP/run" 2>&1; then
				# bf16_kernels=bf16 where the CPU has no bf16 products: refused, with the reason
				if grep -q 'runs sites on the bf16 kernel, but' "$TMP/run"; then
					no_bf16+=("$name") why=$(sed -n 's/.*on the bf16 kernel, but \(.*\): use.*/\1/p' "$TMP/run" | head -1)
					continue
				fi
				fail "$name: run failed: $(tail -2 "$TMP/run")"; continue
			fi
			act=$(sed -n 's/.*activations .* MiB (remat [a-z]*; \([0-9]*\) bytes).*/\1/p' "$TMP/run" | head -1)
			want=$(field "$TMP/plan.json" activation_bytes)
			[ -n "$act" ] && [ "$act" = "$want" ] || fail "$name: activations planned $want, allocated '$act'"
			fsdp=$(sed -n 's/.*fsdp buffers .* MiB (\([0-9]*\) bytes).*/\1/p' "$TMP/run" | head -1)
			want=$(field "$TMP/plan.json" fsdp_buffer_bytes)
			[ "${fsdp:-0}" = "$want" ] || fail "$name: fsdp buffers planned $want, allocated '${fsdp:-none}'"
			echo "ok   $name: activations $act, fsdp buffers ${fsdp:-0} bytes"
		done
	done
done
[ ${#no_bf16[@]} -eq 0 ] || skip_part hardware "${#no_bf16[@]} bfloat16 cases ($why)"
finish
