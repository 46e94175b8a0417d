#!/usr/bin/env bash
# Profiles the training step at the bench shape (llama3-125m, 4 x 512, remat
# none) in two product modes, interleaved: fp32, and bf16 storage on the fp32
# kernels (`dtype=bfloat16 bf16_kernels=fp32`), with `perf record -e cpu-clock`
# (a software clock: it works in VMs without a virtual PMU). Prints each run's
# step seconds and, per mode, the symbols above 0.3% of the samples; oneDNN's
# JIT kernels are named through its perf map (DNNL_JIT_PROFILE=2; the
# /tmp/perf-PID.map files this run leaves are removed at the end).
#   bash bench/profile_modes.sh [--threads N] [--steps N] [--pairs N] [--out DIR]
# Defaults: 1 thread, 4 steps, 2 pairs, /tmp/slicetrain-profile, where each
# run's log and perf.data stay (MODE.PAIR.log, MODE.PAIR.data) for `perf report`.
# ST (slicetrain binary, default build/slicetrain) and PERF (default perf) can
# point into bench/portable.sh's PERF=1 bundle on a machine without our packages.
set -euo pipefail
cd "$(dirname "$0")/.."
ST=${ST:-build/slicetrain}
PERF=${PERF:-perf}
threads=1 steps=4 pairs=2 out=/tmp/slicetrain-profile
while [ $# -gt 0 ]; do
	case $1 in
	--threads) threads=${2-}; shift $(($# > 1 ? 2 : 1)) ;;
	--steps) steps=${2-}; shift $(($# > 1 ? 2 : 1)) ;;
	--pairs) pairs=${2-}; shift $(($# > 1 ? 2 : 1)) ;;
	--out) out=${2-}; shift $(($# > 1 ? 2 : 1)) ;;
	-h|--help) sed -n '2,13p' "$0"; exit 0 ;;
	*) echo "profile_modes.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
done
for v in "$threads" "$steps" "$pairs"; do
	[[ $v =~ ^[1-9][0-9]{0,3}$ ]] ||
		{ echo "profile_modes.sh: --threads, --steps and --pairs take a positive number, not '$v'" >&2; exit 2; }
done
[ -n "$out" ] || { echo "profile_modes.sh: --out needs a directory" >&2; exit 2; }
command -v "$PERF" >/dev/null ||
	{ echo "profile_modes.sh: no '$PERF' (scripts/install-deps.sh --bench installs linux-perf)" >&2; exit 2; }
[ -x "$ST" ] || { echo "profile_modes.sh: no slicetrain at '$ST' (make, or set ST)" >&2; exit 2; }
mkdir -p "$out"
maps_before=$(ls /tmp/perf-*.map 2>/dev/null || true)
flags=$(grep -m1 -o -E 'avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ' || true)
echo "$(bench/cpu.sh), ${flags:-no AVX512_BF16/AMX}"
echo "threads $threads, steps $steps, pairs $pairs, out $out"
for p in $(seq "$pairs"); do
	for mode in fp32 bf16-storage; do
		extra=(dtype=float32)
		[ "$mode" = bf16-storage ] && extra=(dtype=bfloat16 bf16_kernels=fp32)
		tag=$mode.$p
		DNNL_JIT_PROFILE=2 OMP_NUM_THREADS=$threads "$PERF" record -q -e cpu-clock -F 499 \
			-o "$out/$tag.data" -- "$ST" train configs/base.yml model_name=llama3-125m \
			per_device_batch_size=4 max_target_length=512 remat_policy=none "steps=$steps" \
			"${extra[@]}" dataset_type=synthetic "base_output_directory=$out/run" \
			run_name=prof enable_checkpointing=false >"$out/$tag.log" 2>&1 ||
			{ echo "run $tag failed:"; tail -5 "$out/$tag.log"; exit 1; }
		secs=$(sed -n 's/^completed step: \([0-9]*\), seconds: \([0-9.]*\),.*/\2/p' "$out/$tag.log" | tr '\n' ' ')
		echo "$tag: step seconds $secs"
	done
done
rm -rf "$out/run"
report() { "$PERF" report -i "$1" --stdio --no-children --percent-limit 0.3 "${@:2}" 2>/dev/null | grep -v -E '^#|^$' | head -50 || true; }
for mode in fp32 bf16-storage; do
	echo "== $mode, pair 1: samples by object, then by symbol (>= 0.3%)"
	report "$out/$mode.1.data" --sort dso
	report "$out/$mode.1.data" --sort sym
done
for m in /tmp/perf-*.map; do
	[ -e "$m" ] && ! grep -qxF "$m" <<<"$maps_before" && rm -f "$m"
done
true
