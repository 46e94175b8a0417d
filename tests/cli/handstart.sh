# Workers started by hand, without our launcher, under other launchers'
# variables: torchrun / Ray Train (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
# and JAX / MEGASCALE (JAX_COORDINATOR_ADDRESS, JAX_PROCESS_COUNT,
# JAX_PROCESS_ID, MEGASCALE_NUM_SLICES, MEGASCALE_SLICE_ID). A 2-process run
# trains, and matches the losses of the same mesh under our own launcher.
. "$(dirname "$0")/../cli_lib.sh"
common=("$ST_ROOT/configs/base.yml" model_name=llama3-test steps=5 max_target_length=32 per_device_batch_size=2
	learning_rate=1e-3 dataset_type=synthetic base_output_directory="$TMP/o" enable_checkpointing=false)

port=$(free_port)
for r in 0 1; do
	env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
		"$SLICETRAIN" train "${common[@]}" run_name=torchrun ici_fsdp_parallelism=2 metrics_file="$TMP/torchrun.$r.jsonl" \
		>"$TMP/torchrun.$r" 2>&1 &
	pids[$r]=$!
done
for r in 0 1; do wait ${pids[$r]} || fail "torchrun-style rank $r failed: $(tail -2 "$TMP/torchrun.$r")"; done
[ "$(grep -c '^completed step' "$TMP/torchrun.0")" -eq 5 ] || fail "torchrun-style rank 0 did not train 5 steps"

port=$(free_port)
for r in 0 1; do
	env JAX_COORDINATOR_ADDRESS=127.0.0.1:$port JAX_PROCESS_COUNT=2 JAX_PROCESS_ID=$r MEGASCALE_NUM_SLICES=2 \
		MEGASCALE_SLICE_ID=$r TPU_WORKER_ID=0 OMP_NUM_THREADS=1 \
		"$SLICETRAIN" train "${common[@]}" run_name=jax ici_fsdp_parallelism=1 dcn_data_parallelism=2 \
		metrics_file="$TMP/jax.$r.jsonl" >"$TMP/jax.$r" 2>&1 &
	pids[$r]=$!
done
for r in 0 1; do wait ${pids[$r]} || fail "JAX/MEGASCALE-style rank $r failed: $(tail -2 "$TMP/jax.$r")"; done
[ "$(grep -c '^completed step' "$TMP/jax.0")" -eq 5 ] || fail "JAX-style rank 0 did not train 5 steps"
grep -q '2 slices x 1 device' "$TMP/jax.0" || fail "JAX-style run is not 2 slices: $(grep mesh "$TMP/jax.0")"
grep -q '^completed step' "$TMP/jax.1" && fail "only rank 0 prints the step lines"

# the launcher's run of the same mesh gives the same losses
OMP_NUM_THREADS=1 "$SLICETRAIN" launch --num-slices 1 --devices-per-slice 2 -- "${common[@]}" run_name=ours \
	ici_fsdp_parallelism=2 metrics_file="$TMP/ours.jsonl" >"$TMP/ours" 2>&1 || fail "launcher run failed"
same_losses "torchrun-style vs the launcher's" "$TMP/ours.jsonl" "$TMP/torchrun.0.jsonl" 5
echo "torchrun-style and JAX/MEGASCALE-style 2-process runs trained 5 steps each"
finish
