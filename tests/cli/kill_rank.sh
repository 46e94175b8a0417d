# Failing fast: SIGKILL of a random rank at a random moment of a 4-process
# run (started by hand, no launcher); every other rank must exit with status 3
# (peer failure) within 5 s. Repetitions: $KILL_REPS (default 20); each must
# land while training: rank 0 has printed a step, all 4 ranks run just before
# the kill, and the victim dies of it (status 137). A run that does not start
# training (the free port taken by another process meanwhile) is stopped and
# tried again, up to 3 times in all.
. "$(dirname "$0")/../cli_lib.sh"
reps=${KILL_REPS:-20}
worst=0 landed=0 rep=0 retries=0
while [ $rep -lt "$reps" ]; do
	rep=$((rep + 1))
	port=$(free_port)
	pids=()
	# the ranks' redirections truncate in the background: without this the
	# wait below could read the previous repetition's step line
	rm -f "$TMP"/out.* "$TMP"/err.*
	for r in 0 1 2 3; do
		SLICETRAIN_COORDINATOR=127.0.0.1:$port SLICETRAIN_RANK=$r SLICETRAIN_WORLD_SIZE=4 SLICETRAIN_NUM_SLICES=2 \
		OMP_NUM_THREADS=1 "$SLICETRAIN" train "$ST_ROOT/configs/base.yml" model_name=llama3-test steps=100000 \
			per_device_batch_size=1 max_target_length=32 ici_fsdp_parallelism=2 dcn_data_parallelism=2 \
			base_output_directory="$TMP/o" run_name=kill >"$TMP/out.$r" 2>"$TMP/err.$r" &
		pids+=($!)
	done
	# wait until training runs, then a random extra moment
	for _ in $(seq 1 600); do
		grep -q 'completed step' "$TMP/out.0" 2>/dev/null && break
		kill -0 "${pids[0]}" 2>/dev/null || break
		sleep 0.1
	done
	if ! grep -q 'completed step' "$TMP/out.0" && [ $retries -lt 3 ]; then
		retries=$((retries + 1))
		echo "rep $rep: training did not start ($(grep -h -m1 'error:' "$TMP"/err.* | head -1)); again"
		kill -KILL "${pids[@]}" 2>/dev/null
		wait "${pids[@]}" 2>/dev/null
		rep=$((rep - 1))
		continue
	fi
	sleep "0.$((RANDOM % 10))"
	victim=$((RANDOM % 4))
	training=$(grep -c '^completed step' "$TMP/out.0")
	for r in 0 1 2 3; do kill -0 "${pids[$r]}" 2>/dev/null || training=0; done
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
		wait "${pids[$r]}"
		status_is "rep $rep: rank $r after its peer died (3: peer failure)" $? 3 "$TMP/err.$r"
	done
	{ wait "${pids[$victim]}"; } 2>/dev/null
	vst=$?
	if [ "$training" -eq 0 ] || [ $vst -ne 137 ]; then
		fail "rep $rep: the kill did not land while training ($training steps printed, victim's status $vst)"
		continue
	fi
	landed=$((landed + 1))
	worst=$(awk -v a="$worst" -v b="$dt" 'BEGIN{print (b>a)?b:a}')
	echo "rep $rep: killed rank $victim after $training steps; all others gone after ${dt}s (status $(grep -ho 'error: .*' "$TMP"/err.* | head -1))"
done
[ $landed -eq "$reps" ] || fail "only $landed of $reps kills landed while training"
echo "worst time to detect and exit: ${worst}s over $landed kills while training"
finish
