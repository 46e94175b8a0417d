# Gradient accumulation and the remat policies under FSDP (and accumulation
# under tensor parallelism) against one process with the same global batch
# of 4 rows (per_device_batch_size 4, no accumulation, remat full): losses
# within 1e-5 relative at every step, final weights within 1e-4 of each
# tensor's norm. The fsdp runs with 2 micro-batches of 32 tokens keep the
# embedding sharded (2 x 32 < 256) and at 128 tokens gather it.
. "$(dirname "$0")/../cli_lib.sh"
. "$ST_ROOT/tests/mesh_lib.sh"
need_python numpy
for seq in 32 128; do
	common=("$ST_ROOT/configs/base.yml" model_name=llama3-test steps=10 learning_rate=1e-3 warmup_steps_fraction=0
		dataset_type=synthetic base_output_directory="$TMP/o" checkpoint_period=1000 async_checkpointing=false
		max_target_length=$seq)
	mesh_single ref$seq per_device_batch_size=4
	mesh_single accum2_$seq per_device_batch_size=2 gradient_accumulation_steps=2 && mesh_compare ref$seq accum2_$seq
	mesh_launch fsdp2_accum2_$seq 1 2 per_device_batch_size=1 gradient_accumulation_steps=2 ici_fsdp_parallelism=2 \
		&& mesh_compare ref$seq fsdp2_accum2_$seq
	for remat in none minimal; do
		mesh_launch fsdp2_$remat$seq 1 2 per_device_batch_size=2 ici_fsdp_parallelism=2 remat_policy=$remat \
			&& mesh_compare ref$seq fsdp2_$remat$seq
		grep -q "remat $remat" "$TMP/fsdp2_$remat$seq.out" || fail "fsdp2_$remat$seq: the log does not say remat $remat"
	done
done
mesh_launch fsdp2_accum2_minimal 1 2 per_device_batch_size=1 gradient_accumulation_steps=2 ici_fsdp_parallelism=2 \
	remat_policy=minimal && mesh_compare ref128 fsdp2_accum2_minimal
mesh_launch tensor2_accum2 1 2 per_device_batch_size=1 gradient_accumulation_steps=2 ici_fsdp_parallelism=1 \
	ici_tensor_parallelism=2 && mesh_compare ref128 tensor2_accum2
mesh_launch fsdp2_tensor2_accum4 1 4 per_device_batch_size=1 gradient_accumulation_steps=4 ici_fsdp_parallelism=2 \
	ici_tensor_parallelism=2 remat_policy=none
# global batch 16 there: its own reference
mesh_single ref128_16 per_device_batch_size=16 && mesh_compare ref128_16 fsdp2_tensor2_accum4
finish
