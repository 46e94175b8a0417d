#!/usr/bin/env bash
# Checkpoint speed (issue 4) on llama3-125m (weights + two AdamW moments,
# about 1.5 GB), one process: save throughput against this disk's sequential
# write bandwidth (dd conv=fsync, same directory, same run), the training
# stall of an async save against the step time, the slowdown of the step
# that overlaps the background write, and restore throughput against a
# sequential read of the same files.
#   bench/checkpoint.sh [DIR]     (DIR: where to write, default a temporary dir here; build first)
#   BATCH=4 SEQ=512 bench/checkpoint.sh   (the step shape; default 1 x 256)
#   STEPS=10 (default): saves every 2 steps
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-$(mktemp -d "$PWD/.bench-ckpt.XXXXXX")}
trap 'rm -rf "$dir"' EXIT
bin=build/slicetrain
mb=1536
ddw=$(dd if=/dev/zero of="$dir/dd.bin" bs=1M count=$mb conv=fsync 2>&1 | tail -1)
rm -f "$dir/dd.bin"
common=(configs/base.yml model_name=llama3-125m max_target_length=${SEQ:-256} per_device_batch_size=${BATCH:-1} remat_policy=full
	dataset_type=synthetic base_output_directory="$dir" run_name=bench learning_rate=1e-4 checkpoint_period=2
	max_num_checkpoints_to_keep=2)
"$bin" train "${common[@]}" steps=${STEPS:-10} >"$dir/train.out" 2>"$dir/train.err"
step=$(grep '^completed step' "$dir/train.out" | tail -n +2 | sed 's/.*seconds: \([0-9.]*\),.*/\1/' | sort -g |
	awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
echo "== save"
echo "dd write (conv=fsync, ${mb} MiB): $ddw"
grep 'checkpoint step' "$dir/train.err" | sed 's/^slicetrain: /  /'
grep 'checkpoints:' "$dir/train.err" | sed 's/^slicetrain: /  /'
stall=$(grep 'checkpoint step' "$dir/train.err" | tail -1 | sed 's/.*stalled \([0-9.]*\) s.*/\1/')
awk -v s="$stall" -v t="$step" 'BEGIN{printf "  stall of the last async save: %.3f s = %.1f%% of a %.3f s step (target: at most 5%%)\n", s, 100*s/t, t}'
# The background write (CRC-32, O_DIRECT writes, fsync, commit) runs during
# the step after a save and competes with it for the cores: that step's extra
# time is the rest of the save's cost, beyond the stall.
grep '^completed step' "$dir/train.out" | sed 's/completed step: \([0-9]*\), seconds: \([0-9.]*\),.*/\1 \2/' |
	awk -v p=2 '$1 > 0 { if ($1 % p == 0) { a[++na] = $2 } else if ($1 > 1) { b[++nb] = $2 } }
	function med(x, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (x[j] < x[i]) { t = x[i]; x[i] = x[j]; x[j] = t }
		return n % 2 ? x[(n + 1) / 2] : (x[n / 2] + x[n / 2 + 1]) / 2 }
	END { if (na && nb) { ma = med(a, na); mb = med(b, nb)
		printf "  steps overlapping a background write: median %.3f s, other steps %.3f s: %+.1f%%\n", ma, mb, 100 * (ma - mb) / mb } }'
echo "== restore"
"$bin" train "${common[@]}" steps=$((${STEPS:-10} + 1)) checkpoint_period=1000 save_checkpoint_on_completion=false >/dev/null 2>"$dir/restore.err"
grep 'restored step' "$dir/restore.err" | sed 's/^slicetrain: /  /'
shard=$(ls "$dir"/bench/checkpoints/${STEPS:-10}/shard-*.safetensors)
sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null && echo "  (page cache dropped before the read)" || echo "  (page cache not dropped: reads may come from memory)"
echo "  sequential read of the shard: $(dd if="$shard" of=/dev/null bs=1M 2>&1 | tail -1)"
