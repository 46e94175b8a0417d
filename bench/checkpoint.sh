#!/usr/bin/env bash
# Checkpoint cost (issue 14, items 3 and 4) on llama3-125m (weights + two
# AdamW moments, about 1.5 GB), one process, 2 threads. It reports the
# done-when figures:
#   - stall / step: the time a save blocks training (st_ckpt_save, plus the
#     wait of the next update for the copy when the copy is deferred) over
#     the median step of the run without saves;
#   - whole cost / step: (wall time of a run saving every PERIOD steps - wall
#     time of the same run without checkpointing) / number of saves, over the
#     same step (wall time: from the line of step 0 to the process's exit, so
#     the last save's commit counts); the CPU time (user + sys) difference per
#     save is printed beside it, being less sensitive to other load;
#   - the step overlapping a save against the same run's other steps: what
#     the background write costs the training threads, free of the host's
#     drift from one run to the next (which moved the whole cost by up to a
#     step per save on a 2-vCPU VM);
#   - restore rate vs a sequential read (dd bs=8M) of the same shard file,
#     each after dropping the page cache (echo 3 > drop_caches; where that is
#     refused, posix_fadvise(DONTNEED) on the files: the script says which).
# Runs are interleaved (for each repetition: shape by shape, the run without
# saves, then each binary's run with saves; even repetitions in the reverse
# order), medians of REPS.
#   bench/checkpoint.sh                      (build first; about 25 min with both shapes on 2 cores)
#   BINS="build/slicetrain-old build/slicetrain" bench/checkpoint.sh   (compare binaries, interleaved)
#   SHAPES="1x256 4x512" (default)  REPS=3  PERIOD=5  STEPS=11 (saves after steps 5 and 10)
#   STEPS_4x512=6 (per-shape override: one save)  DIR=where to write (default a temporary dir here)
set -euo pipefail
cd "$(dirname "$0")/.."
BINS=${BINS:-build/slicetrain}
SHAPES=${SHAPES:-1x256 4x512}
REPS=${REPS:-3}
PERIOD=${PERIOD:-5}
dir=${DIR:-$(mktemp -d "$PWD/.bench-ckpt.XXXXXX")}
[ -n "${DIR:-}" ] || trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir"
echo "$(bench/cpu.sh); $(uptime | sed 's/.*load/load/')"

med() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# drop the page cache (or the files' pages), printing how
drop() {
	sync
	if echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
		echo drop_caches
	else
		python3 -c 'import os, sys
for f in sys.argv[1:]:
    fd = os.open(f, os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$@"
		echo fadvise_dontneed
	fi
}

# step_median OUT OVERLAP: the median time of the steps (after step 0) of a
# run's output that overlap a save (OVERLAP 1: every PERIOD-th) or not (0)
step_median() {
	awk -v p="$PERIOD" -v want="$2" '$2 == "completed" {st = $4 + 0; sub(",", "", $6)
		if (st > 0 && (st % p == 0) == want) print $6}' "$1" | med
}

# run BIN SHAPE MODE(nosave|save) TAG: one training run; prints
# "step_median wall cpu nsaves stall_per_save overlap_step_median background_cpu_per_save
# other_step_median" (the last: the median of the same run's steps that overlap no save)
run() {
	local bin=$1 shape=$2 mode=$3 tag=$4 b=${2%x*} s=${2#*x} out=$dir/$4
	local steps_var=STEPS_$2 steps
	steps=${!steps_var:-${STEPS:-11}}
	local args=(configs/base.yml model_name=llama3-125m max_target_length=$s per_device_batch_size=$b remat_policy=full
		dataset_type=synthetic base_output_directory="$dir/$tag.d" run_name=bench learning_rate=1e-4 steps=$steps
		checkpoint_period=$PERIOD save_checkpoint_on_completion=false max_num_checkpoints_to_keep=1)
	[ "$mode" = save ] || args+=(enable_checkpointing=false)
	rm -rf "$dir/$tag.d"
	/usr/bin/time -f '%U %S' -o "$out.time" "$bin" train "${args[@]}" 2>"$out.err" |
		while IFS= read -r l; do printf '%s %s\n' "$EPOCHREALTIME" "$l"; done >"$out.out"
	local end=$EPOCHREALTIME
	local t0 step wall cpu n stall ov bg oth
	t0=$(awk '$2 == "completed" && $4 == "0," {print $1}' "$out.out")
	wall=$(awk -v a="$t0" -v b="$end" 'BEGIN {printf "%.3f", b - a}')
	cpu=$(awk 'NR == 1 {printf "%.2f", $1 + $2}' "$out.time")
	step=$(awk '$2 == "completed" && $4 != "0," {sub(",", "", $6); print $6}' "$out.out" | med)
	n=$(grep -c 'training stalled' "$out.err" || true)
	# the stall of each save: the save call, plus the next update's wait for the copy
	stall=$(awk '/training stalled/ {for (i = 1; i <= NF; i++) if ($i == "stalled") s += $(i+1)}
		/update waited/ {for (i = 1; i <= NF; i++) if ($i == "waited") s += $(i+1)}
		END {printf "%.3f", NR ? s : 0}' "$out.err")
	[ "$n" -gt 0 ] && stall=$(awk -v s="$stall" -v n="$n" 'BEGIN {printf "%.3f", s / n}')
	ov=$(step_median "$out.out" 1)
	oth=$(step_median "$out.out" 0)
	bg=$(sed -n 's/.*background CPU \([0-9.]*\) s per save.*/\1/p' "$out.err")
	grep -q 'FAILED' "$out.err" && { echo "run $tag: a save FAILED" >&2; cat "$out.err" >&2; exit 1; }
	echo "$step $wall $cpu $n $stall $ov ${bg:-0} $oth"
}

declare -A R
# even repetitions run the saving runs first: a host whose speed drifts
# during the bench (seen: every run faster than the one before for minutes)
# then does not favour one side
nosave_run() {
	R[$shape.nosave.$rep]=$(run "${BINS%% *}" "$shape" nosave "$shape-nosave-$rep")
	echo "rep $rep $shape nosave: ${R[$shape.nosave.$rep]}  ($(uptime | sed 's/.*load/load/'))"
}
for rep in $(seq 1 "$REPS"); do
	for shape in $SHAPES; do
		[ $((rep % 2)) = 0 ] || nosave_run
		bi=0
		for bin in $BINS; do
			bi=$((bi + 1))
			R[$shape.$bi.$rep]=$(run "$bin" "$shape" save "$shape-save$bi-$rep")
			echo "rep $rep $shape save $bin: ${R[$shape.$bi.$rep]}  ($(uptime | sed 's/.*load/load/'))"
		done
		[ $((rep % 2)) = 1 ] || nosave_run
	done
done

echo "== save (columns per run: step s, wall s, cpu s, saves, stall per save s, step overlapping a save s, background CPU per save s, other steps s)"
for shape in $SHAPES; do
	bi=0
	for bin in $BINS; do
		bi=$((bi + 1))
		stalls= costs= cpus= steps= bgs= ins=
		for rep in $(seq 1 "$REPS"); do
			read -r step0 wall0 cpu0 _ <<<"${R[$shape.nosave.$rep]}"
			read -r _ wall1 cpu1 n stall ov bg oth <<<"${R[$shape.$bi.$rep]}"
			# within the run: how much longer the step overlapping a save is than
			# the run's other steps (the host's drift between runs cancels)
			in=$(awk -v a="$ov" -v b="$oth" 'BEGIN{print 100*(a-b)/b}')
			c=$(awk -v a="$wall1" -v b="$wall0" -v n="$n" 'BEGIN {printf "%.3f", (a - b) / n}')
			cc=$(awk -v a="$cpu1" -v b="$cpu0" -v n="$n" 'BEGIN {printf "%.3f", (a - b) / n}')
			printf '  %s %s rep %d: step %.3f s; stall %.3f s (%.1f%%); whole cost %.3f s (%.1f%%), cpu %+.3f s per save; overlapping step %.3f s (%+.1f%%; %+.1f%% of this run'"'"'s other steps); background CPU %.3f s per save\n' \
				"$shape" "$bin" "$rep" "$step0" "$stall" "$(awk -v a="$stall" -v b="$step0" 'BEGIN{print 100*a/b}')" \
				"$c" "$(awk -v a="$c" -v b="$step0" 'BEGIN{print 100*a/b}')" "$cc" "$ov" \
				"$(awk -v a="$ov" -v b="$step0" 'BEGIN{print 100*(a-b)/b}')" "$in" "$bg"
			bgs+="$bg"$'\n'
			ins+="$in"$'\n'
			stalls+="$(awk -v a="$stall" -v b="$step0" 'BEGIN{print 100*a/b}')"$'\n'
			costs+="$(awk -v a="$c" -v b="$step0" 'BEGIN{print 100*a/b}')"$'\n'
			cpus+="$cc"$'\n'
			steps+="$step0"$'\n'
		done
		printf '%s %s MEDIAN: step %.3f s, stall %.1f%% of a step (target <= 5%%), whole cost %.1f%% of a step (target <= 30%%), cpu %+.3f s per save, background CPU %.3f s per save, step overlapping a save %+.1f%% of its run'"'"'s other steps\n' \
			"$shape" "$bin" "$(printf '%s' "$steps" | med)" "$(printf '%s' "$stalls" | med)" \
			"$(printf '%s' "$costs" | med)" "$(printf '%s' "$cpus" | med)" "$(printf '%s' "$bgs" | med)" \
			"$(printf '%s' "$ins" | med)"
	done
done

echo "== restore (the checkpoint of the last run with saves; page cache dropped before each read)"
last=$(ls -d "$dir"/*-save*-"$REPS".d | tail -1)
sdir=$(ls -d "$last"/bench/checkpoints/[0-9]* | sort -t/ -k1 | tail -1)
step=$(basename "$sdir")
shards=("$sdir"/shard-*.safetensors)
for rep in $(seq 1 "$REPS"); do
	for bin in $BINS; do
		how=$(drop "${shards[@]}")
		"$bin" train configs/base.yml model_name=llama3-125m remat_policy=full dataset_type=synthetic \
			base_output_directory="$last" run_name=bench steps="$step" max_target_length=64 \
			>/dev/null 2>"$dir/restore.err"
		r=$(sed -n 's/.*restored step.* (\([0-9.]*\) MB\/s[;)].*/\1/p' "$dir/restore.err")
		echo "restore $bin rep $rep: $r MB/s ($how; $(uptime | sed 's/.*load/load/'))"
		echo "$r" >>"$dir/restore.$(echo "$bin" | tr / _)"
	done
	how=$(drop "${shards[@]}")
	t0=$EPOCHREALTIME
	for f in "${shards[@]}"; do dd if="$f" of=/dev/null bs=8M iflag=fullblock 2>/dev/null; done
	t1=$EPOCHREALTIME
	bytes=$(cat "${shards[@]}" | wc -c)
	r=$(awk -v b="$bytes" -v a="$t0" -v c="$t1" 'BEGIN {printf "%.0f", b / 1e6 / (c - a)}')
	echo "sequential read (dd bs=8M) rep $rep: $r MB/s ($how)"
	echo "$r" >>"$dir/restore.seq"
	how=$(drop "${shards[@]}")
	t0=$EPOCHREALTIME
	for f in "${shards[@]}"; do dd if="$f" of=/dev/null bs=8M iflag=direct 2>/dev/null; done
	t1=$EPOCHREALTIME
	r=$(awk -v b="$bytes" -v a="$t0" -v c="$t1" 'BEGIN {printf "%.0f", b / 1e6 / (c - a)}')
	echo "sequential read (dd bs=8M iflag=direct) rep $rep: $r MB/s ($how)"
	echo "$r" >>"$dir/restore.seqd"
done
seq=$(med <"$dir/restore.seq")
seqd=$(med <"$dir/restore.seqd")
for bin in $BINS; do
	r=$(med <"$dir/restore.$(echo "$bin" | tr / _)")
	echo "restore $bin MEDIAN: $r MB/s = $(awk -v a="$r" -v b="$seq" 'BEGIN {printf "%.0f", 100 * a / b}')% of the buffered sequential read's $seq MB/s, $(awk -v a="$r" -v b="$seqd" 'BEGIN {printf "%.0f", 100 * a / b}')% of the direct one's $seqd MB/s (target >= 80%)"
done
