# dtype=bfloat16 under FSDP, tensor parallelism and both, against its own
# single-process bf16 run with the same global batch: every one of 10 steps'
# loss within 1e-2 relative (bf16 products round differently when the
# products are split, so not 1e-5). Each run must really be bf16 (the log
# says so) and differ from fp32. Skipped (77) on CPUs
# without AVX512_BF16.
. "$(dirname "$0")/../cli_lib.sh"
. "$ST_ROOT/tests/mesh_lib.sh"
grep -qw avx512_bf16 /proc/cpuinfo || skip_hw "bf16 needs AVX512_BF16 (no avx512_bf16 in /proc/cpuinfo)"
MESH_EXPORT=0
common=("$ST_ROOT/configs/base.yml" model_name=llama3-test steps=10 learning_rate=1e-3 warmup_steps_fraction=0
	dataset_type=synthetic base_output_directory="$TMP/o" enable_checkpointing=false max_target_length=64 dtype=bfloat16)
mesh_single ref per_device_batch_size=4
mesh_single ref_fp32 per_device_batch_size=4 dtype=float32
cmp -s "$TMP/ref.loss" "$TMP/ref_fp32.loss" && fail "bf16 and fp32 runs gave the same losses (bf16 not in effect)"
mesh_launch fsdp2 1 2 per_device_batch_size=2 ici_fsdp_parallelism=2 && mesh_compare_losses ref fsdp2 1e-2
mesh_launch tensor2 1 2 per_device_batch_size=2 ici_fsdp_parallelism=1 ici_tensor_parallelism=2 \
	&& mesh_compare_losses ref tensor2 1e-2
mesh_launch fsdp2_tensor2 1 4 per_device_batch_size=1 ici_fsdp_parallelism=2 ici_tensor_parallelism=2 \
	&& mesh_compare_losses ref fsdp2_tensor2 1e-2
for r in ref fsdp2 tensor2 fsdp2_tensor2; do
	grep -q 'bf16 activations and products' "$TMP/$r.out" || fail "$r: the log does not say bf16"
done
finish
