# Failing fast: SIGKILL of a random rank at a random moment of a 4-process
# run (started by hand, no launcher); every other rank must exit non-zero
# within 5 s. Repetitions: $KILL_REPS (default 20).
. "$(dirname "$0")/../cli_lib.sh"
reps=${KILL_REPS:-20}
worst=0
for rep in $(seq 1 "$reps"); do
	port=$(free_port)
	pids=()
	for r in 0 1 2 3; do
		SLICETRAIN_COORDINATOR=127.0.0.1:$port SLICETRAIN_RANK=$r SLICETRAIN_WORLD_SIZE=4 SLICETRAIN_NUM_SLICES=2 \
		OMP_NUM_THREADS=1 "$SLICETRAIN" train "$ST_ROOT/configs/base.yml" model_name=llama3-test steps=100000 \
			per_device_batch_size=1 max_target_length=32 ici_fsdp_parallelism=2 dcn_data_parallelism=2 \
			base_output_directory="$TMP/o" run_name=kill >"$TMP/out.$r" 2>"$TMP/err.$r" &
		pids+=($!)
	done
	# wait until training runs, then a random extra moment
	for _ in $(seq 1 100); do grep -q 'completed step' "$TMP/out.0" 2>/dev/null && break; sleep 0.1; done
	sleep "0.$((RANDOM % 10))"
	victim=$((RANDOM % 4))
	kill -KILL "${pids[$victim]}"
	t0=$EPOCHREALTIME
	# every survivor must be gone within 5 s of the kill
	for _ in $(seq 1 100); do
		left=0
		for r in 0 1 2 3; do [ "$r" -ne "$victim" ] && kill -0 "${pids[$r]}" 2>/dev/null && left=1; done
		[ $left -eq 0 ] && break
		sleep 0.05
	done
	dt=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.2f", b-a}')
	for r in 0 1 2 3; do
		[ "$r" -eq "$victim" ] && continue
		if kill -0 "${pids[$r]}" 2>/dev/null; then
			fail "rep $rep: rank $r still running 5 s after rank $victim was killed"
			kill -KILL "${pids[$r]}"
		fi
		wait "${pids[$r]}"; st=$?
		[ "$st" -eq 3 ] || fail "rep $rep: rank $r exited with status $st after its peer died, want 3 (peer failure)"
	done
	{ wait "${pids[$victim]}"; } 2>/dev/null
	worst=$(awk -v a="$worst" -v b="$dt" 'BEGIN{print (b>a)?b:a}')
	echo "rep $rep: killed rank $victim; all others gone after ${dt}s (status $(grep -ho 'error: .*' "$TMP"/err.* | head -1))"
done
echo "worst time to detect and exit: ${worst}s over $reps repetitions"
finish
