# Bit-exact resume: 20 steps straight, and 20 steps killed (SIGKILL) after the
# step-10 checkpoint then run again (auto-resume), give the same losses for
# every step (the metrics files, bit for bit), the same log lines apart from
# timings, and byte-identical exported weights; on one process and on a
# 4-process mesh (2 slices x ici_fsdp 2, dcn_data 2). The saves take their
# checksums from the update (st_adamw_update_crc), which the restore checks.
. "$(dirname "$0")/../cli_lib.sh"
common=("$ST_ROOT/configs/base.yml" model_name=llama3-test steps=20 max_target_length=256
	learning_rate=1e-3 dataset_type=synthetic base_output_directory="$TMP/o" checkpoint_period=10 log_period=1)
strip() { grep '^completed step' "$1" | sed -E 's/seconds: [0-9.]+, TFLOP\/s\/device: [0-9.]+, Tokens\/s\/device: [0-9.]+/T/'; }

# run single|mesh run_name batch log extra... (metrics in $log.jsonl; flushed
# every step: log_period=1). With EXEC=1 (in the background) the subshell
# becomes the trainer or launcher, so that $! is its pid: killing the
# subshell alone left a launcher running beside the resumed run.
run() {
	local mode=$1 name=$2 batch=$3 log=$4; shift 4
	set -- metrics_file="$log.jsonl" "$@"
	if [ "$mode" = single ]; then
		OMP_NUM_THREADS=1 ${EXEC:+exec} "$SLICETRAIN" train "${common[@]}" run_name="$name" per_device_batch_size="$batch" "$@" >>"$log" 2>>"$log.err"
	else
		OMP_NUM_THREADS=1 ${EXEC:+exec} "$SLICETRAIN" launch --num-slices 2 --devices-per-slice 2 -- "${common[@]}" run_name="$name" \
			per_device_batch_size="$batch" ici_fsdp_parallelism=2 dcn_data_parallelism=2 "$@" >>"$log" 2>>"$log.err"
	fi
}

# Is process $1 running (not gone, not a zombie waiting to be reaped)?
running() {
	local st
	st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) && [ -n "$st" ] && [ "$st" != Z ]
}

for mode in single mesh; do
	batch=8; [ $mode = mesh ] && batch=2
	run $mode straight-$mode $batch "$TMP/straight-$mode" || fail "$mode: straight run failed: $(tail -3 "$TMP/straight-$mode.err")"
	# the saves took their checksums from the update (the resumed run's restore checks them)
	for s in 10 20; do
		grep -q "checkpoint step $s: .*(checksums from the update)" "$TMP/straight-$mode.err" \
			|| fail "$mode: the save of step $s did not take its checksums from the update"
	done
	# the interrupted run: SIGKILL once step 10 is committed and a later step
	# is printed (waiting as long as the run runs: a sanitized 4-process mesh
	# on a slow host took more than the 10-20 s a fixed count of polls gave it)
	EXEC=1 run $mode cut-$mode $batch "$TMP/cut-$mode" &
	pid=$!
	while running $pid; do
		[ -f "$TMP/o/cut-$mode/checkpoints/10/manifest.json" ] && grep -q 'completed step: 1[1-9]' "$TMP/cut-$mode" && break
		sleep 0.005
	done
	kill -KILL $pid 2>/dev/null; wait $pid 2>/dev/null
	[ -d "$TMP/o/cut-$mode/checkpoints/20" ] && [ -f "$TMP/o/cut-$mode/checkpoints/20/manifest.json" ] \
		&& { fail "$mode: the run finished before it was killed; make its steps slower"; continue; }
	killed_at=$(grep -c '^completed step' "$TMP/cut-$mode")
	run $mode cut-$mode $batch "$TMP/resumed-$mode" || fail "$mode: resumed run failed: $(tail -3 "$TMP/resumed-$mode.err")"
	grep -q 'restored step 10' "$TMP/resumed-$mode.err" || fail "$mode: did not resume from step 10"
	# steps 0..9 from the first part, 10..19 from the resumed part
	{ head -n 10 "$TMP/cut-$mode.jsonl"; cat "$TMP/resumed-$mode.jsonl"; } >"$TMP/joined-$mode.jsonl"
	same_losses "$mode: straight vs killed and resumed" "$TMP/straight-$mode.jsonl" "$TMP/joined-$mode.jsonl" 20
	{ strip "$TMP/cut-$mode" | head -10; strip "$TMP/resumed-$mode"; } >"$TMP/joined-$mode"
	[ "$(wc -l <"$TMP/joined-$mode")" -eq 20 ] || fail "$mode: $(wc -l <"$TMP/joined-$mode") loss lines, want 20"
	cmp -s <(strip "$TMP/straight-$mode") "$TMP/joined-$mode" \
		|| fail "$mode: loss lines differ: $(diff <(strip "$TMP/straight-$mode") "$TMP/joined-$mode" | head -4)"
	for r in straight cut; do
		"$SLICETRAIN" export "$TMP/o/$r-$mode/checkpoints/20" "$TMP/hf-$r-$mode" >/dev/null 2>&1 || fail "$mode: export of $r failed"
	done
	[ -s "$TMP/hf-straight-$mode/model.safetensors" ] && cmp -s "$TMP/hf-straight-$mode/model.safetensors" "$TMP/hf-cut-$mode/model.safetensors" \
		|| fail "$mode: final weights differ"
	shard=shard-00000-of-0000$([ $mode = mesh ] && echo 4 || echo 1).safetensors
	[ -s "$TMP/o/straight-$mode/checkpoints/20/$shard" ] &&
		cmp -s "$TMP/o/straight-$mode/checkpoints/20/$shard" "$TMP/o/cut-$mode/checkpoints/20/$shard" \
		|| fail "$mode: final optimizer state differs"
	echo "$mode: killed after $killed_at printed steps, resumed from 10; 20 loss lines and final weights identical"
done
finish
