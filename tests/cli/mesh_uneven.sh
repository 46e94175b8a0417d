# Meshes beyond mesh_equivalence's size-2 axes, against one process with the
# same global batch (losses 1e-5 relative every step, final weights 1e-4 of
# each tensor's norm):
#  - an axis of size 4: ici_fsdp=4, and ici_tensor=4 (llama3-test has 2 kv
#    heads, so that run sets base_num_kv_heads=4 with override_model_config,
#    and so does its reference);
#  - an fsdp axis of 3, which splits no tensor of llama3-test evenly (256
#    vocabulary rows, 64 emb, 128 mlp: 85/85/86, 21/21/22, 42/43/43 rows),
#    with the embedding kept sharded (3 x 32 tokens < 256) and gathered
#    (3 x 128 > 256), and over 3 slices (dcn_fsdp=3);
#  - tensor parallelism that does not divide the heads (3) is refused: exit 2,
#    one "slicetrain: error:" line naming the key (a launched group: the same one
#    message from each rank that reports it), no training.
. "$(dirname "$0")/../cli_lib.sh"
. "$ST_ROOT/tests/mesh_lib.sh"
need_python numpy
base=("$ST_ROOT/configs/base.yml" model_name=llama3-test steps=10 learning_rate=1e-3 warmup_steps_fraction=0
	dataset_type=synthetic base_output_directory="$TMP/o" checkpoint_period=1000 async_checkpointing=false)
common=("${base[@]}" max_target_length=32)

# (a) size-4 axes: global batch 4
mesh_single ref4 per_device_batch_size=4
mesh_launch fsdp4 1 4 per_device_batch_size=1 ici_fsdp_parallelism=4 && mesh_compare ref4 fsdp4
kv4=(override_model_config=true base_num_kv_heads=4)
mesh_single ref4_kv4 per_device_batch_size=4 "${kv4[@]}"
mesh_launch tensor4 1 4 per_device_batch_size=1 ici_fsdp_parallelism=1 ici_tensor_parallelism=4 "${kv4[@]}" \
	&& mesh_compare ref4_kv4 tensor4

# (b) fsdp 3: global batch 3
mesh_single ref3 per_device_batch_size=3
mesh_launch fsdp3 1 3 per_device_batch_size=1 ici_fsdp_parallelism=3 && mesh_compare ref3 fsdp3
grep -q 'fsdp buffers' "$TMP/fsdp3.out" || fail "fsdp3: no ZeRO-3 buffers in the log (not sharded?)"
mesh_launch dcn_fsdp3 3 1 per_device_batch_size=1 ici_fsdp_parallelism=1 dcn_fsdp_parallelism=3 dcn_data_parallelism=1 \
	&& mesh_compare ref3 dcn_fsdp3
common=("${base[@]}" max_target_length=128)
mesh_single ref3_seq128 per_device_batch_size=3
mesh_launch fsdp3_seq128 1 3 per_device_batch_size=1 ici_fsdp_parallelism=3 && mesh_compare ref3_seq128 fsdp3_seq128

# (c) tensor 3 does not divide 4 heads: plan and a 3-process group refuse it
expect_error "plan tensor 3" 'num_query_heads 4 is not divisible by the tensor parallelism 3.*ici_tensor_parallelism' -- \
	plan "${common[@]}" ici_fsdp_parallelism=1 ici_tensor_parallelism=3 --devices-per-slice 3
OMP_NUM_THREADS=1 timeout 60 "$SLICETRAIN" launch --num-slices 1 --devices-per-slice 3 -- "${common[@]}" run_name=tp3 \
	per_device_batch_size=1 ici_fsdp_parallelism=1 ici_tensor_parallelism=3 >"$TMP/tp3.out" 2>&1
rc=$?
# every rank fails the same check; the launcher stops the others when the
# first exits, so rank 0's own line may or may not come first: the same one
# message (after the "[rank N] " prefix) from however many ranks got to it
msgs=$(sed -n 's/^\(\[rank [0-9]*\] \)\{0,1\}slicetrain: error: //p' "$TMP/tp3.out" | sort -u)
nmsg=$(printf '%s' "$msgs" | grep -c .)
if [ $rc -ne 2 ] || [ "$nmsg" -ne 1 ] || ! grep -q 'ici_tensor_parallelism' <<<"$msgs"; then
	fail "launch with tensor 3: exit $rc (want 2), $nmsg distinct error messages (want 1 naming ici_tensor_parallelism)"
	sed 's/^/    /' "$TMP/tp3.out" | tail -8 >&2
else
	echo "ok   launch tensor 3: exit 2, $msgs"
fi
grep -q 'completed step' "$TMP/tp3.out" && fail "launch with tensor 3 trained"
finish
