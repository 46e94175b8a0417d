# The same global batch trained on one process and on each mesh of issue 3
# gives the same losses (1e-5 relative, every step) and the same final weights
# (per tensor, |w - w_ref| <= 1e-4 |w_ref|); the same mesh twice is
# bit-identical. (More meshes: mesh_uneven, mesh_accum_remat, mesh_bf16.)
. "$(dirname "$0")/../cli_lib.sh"
. "$ST_ROOT/tests/mesh_lib.sh"
need_python numpy
common=("$ST_ROOT/configs/base.yml" model_name=llama3-test steps=10
	learning_rate=1e-3 warmup_steps_fraction=0 dataset_type=synthetic base_output_directory="$TMP/o"
	checkpoint_period=1000 async_checkpointing=false max_target_length=32)
# global batch 4 rows everywhere: per_device_batch_size x devices
mesh_single ref per_device_batch_size=4
mesh_launch fsdp2 1 2 per_device_batch_size=2 ici_fsdp_parallelism=2 && mesh_compare ref fsdp2
mesh_launch tensor2 1 2 per_device_batch_size=2 ici_fsdp_parallelism=1 ici_tensor_parallelism=2 && mesh_compare ref tensor2
mesh_launch data2 1 2 per_device_batch_size=2 ici_fsdp_parallelism=1 ici_data_parallelism=2 && mesh_compare ref data2
mesh_launch fsdp2_tensor2 1 4 per_device_batch_size=1 ici_fsdp_parallelism=2 ici_tensor_parallelism=2 \
	&& mesh_compare ref fsdp2_tensor2
mesh_launch s2_fsdp2_dcndata2 2 2 per_device_batch_size=1 ici_fsdp_parallelism=2 dcn_data_parallelism=2 \
	&& mesh_compare ref s2_fsdp2_dcndata2
mesh_launch s2_tensor2_dcnfsdp2 2 2 per_device_batch_size=1 ici_fsdp_parallelism=1 ici_tensor_parallelism=2 \
	dcn_fsdp_parallelism=2 dcn_data_parallelism=1 && mesh_compare ref s2_tensor2_dcnfsdp2
# the same mesh twice: bit-identical losses
mesh_launch fsdp2_tensor2_again 1 4 per_device_batch_size=1 ici_fsdp_parallelism=2 ici_tensor_parallelism=2
cmp -s "$TMP/fsdp2_tensor2.loss" "$TMP/fsdp2_tensor2_again.loss" || fail "the same mesh twice gave different losses"
cmp -s "$TMP/hf-fsdp2_tensor2/model.safetensors" "$TMP/hf-fsdp2_tensor2_again/model.safetensors" \
	|| fail "the same mesh twice gave different weights"
# Above, an fsdp group's tokens per micro-batch (4 x 32) are fewer than the
# vocabulary (256): the embedding stays sharded. At 4 x 128 it is gathered.
common=("${common[@]}" max_target_length=128)
mesh_single ref128 per_device_batch_size=4
mesh_launch fsdp2_seq128 1 2 per_device_batch_size=2 ici_fsdp_parallelism=2 && mesh_compare ref128 fsdp2_seq128
finish
