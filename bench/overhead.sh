#!/usr/bin/env bash
# Distributed overhead (issue 3): per-device Tokens/s of 2 processes x 1
# thread (ici_fsdp_parallelism=2, shared memory) against 1 process x 1 thread
# training half the global batch, on llama3-125m at max_target_length 256.
# Target: at least 85%. Prints the median Tokens/s/device of steps 2..N.
#   bench/overhead.sh [steps]     (build first: make)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-8}
bin=build/slicetrain
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(configs/base.yml model_name=llama3-125m max_target_length=256 per_device_batch_size=1
	steps="$steps" dataset_type=synthetic remat_policy=full enable_checkpointing=false
	base_output_directory="$tmp" learning_rate=1e-4)
bench/cpu.sh
median() { grep '^completed step' "$1" | tail -n +3 | sed 's/.*Tokens\/s\/device: \([0-9.]*\),.*/\1/' | sort -g |
	awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
OMP_NUM_THREADS=1 taskset -c 0 "$bin" train "${common[@]}" run_name=one >"$tmp/one" 2>"$tmp/one.err"
OMP_NUM_THREADS=1 "$bin" launch --num-slices 1 --devices-per-slice 2 -- "${common[@]}" run_name=two \
	ici_fsdp_parallelism=2 >"$tmp/two" 2>"$tmp/two.err"
one=$(median "$tmp/one"); two=$(median "$tmp/two")
printf '1 process  x 1 thread, batch 1:           %10.2f Tokens/s/device\n' "$one"
printf '2 processes x 1 thread, fsdp 2, batch 1 each: %7.2f Tokens/s/device\n' "$two"
awk -v a="$one" -v b="$two" 'BEGIN{printf "ratio: %.1f%% (target: at least 85%%)\n", 100 * b / a}'
