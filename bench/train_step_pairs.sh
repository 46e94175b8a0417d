#!/usr/bin/env bash
# Interleaved pairs of training-step measurements of two slicetrain
# binaries: is a change as fast as what it replaced? Builds
# build/bench_train_step (as bench/train_step.sh does) and runs it PAIRS
# times for each binary, alternating BEFORE, AFTER, BEFORE, ... (which one
# goes first alternates too), one repetition each (--reps 1 --no-torch
# --no-remat; the step: llama3-125m, batch 4 x 512, remat none). Then, per
# mode and thread count, each pair's AFTER / BEFORE ratio of tokens/s, their
# median and their range (the spread).
#
#   bench/train_step_pairs.sh BEFORE_BINARY AFTER_BINARY [PAIRS (7)] [OUTDIR]
#
# MODES (default fp32,bf16) and THREADS (default 1,2) choose the rows;
# STEPS (default 4: the median of the 3 after the first). Each run's output
# is kept in OUTDIR (default a new directory under /tmp). Run it on an
# otherwise idle machine: the cpu column of the runs says when other jobs
# took cores.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,/^set -eu/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 2; }
cd "$(dirname "$0")/.."
before=$(realpath "$1") after=$(realpath "$2") pairs=${3:-7}
out=${4:-$(mktemp -d /tmp/train-step-pairs.XXXXXX)}
[[ "$pairs" =~ ^[1-9][0-9]*$ ]] || { echo "train_step_pairs: PAIRS='$pairs' is not a positive number" >&2; exit 2; }
for b in "$before" "$after"; do [ -x "$b" ] || { echo "train_step_pairs: no binary $b" >&2; exit 2; }; done
mkdir -p "$out"
make -s -j2 build/libslicetrain.a
ldlibs=$(make -s --no-print-directory -f Makefile -f <(printf 'print-ldlibs:\n\t@echo $(LDLIBS)\n') print-ldlibs)
${CC:-cc} -O2 -march=native -std=c11 -D_GNU_SOURCE -Wall -Wextra -fopenmp -Isrc \
	bench/train_step.c build/libslicetrain.a -o build/bench_train_step $ldlibs -lm
args=(--reps 1 --no-torch --no-remat --threads "${THREADS:-1,2}" --st-modes "${MODES:-fp32,bf16}" --steps "${STEPS:-4}")
echo "train_step_pairs: $pairs pairs; before $before, after $after; $(date -u '+%Y-%m-%d %H:%M UTC'); outputs in $out"
for i in $(seq 1 "$pairs"); do
	order=(before after)
	[ $((i % 2)) = 0 ] && order=(after before)
	for side in "${order[@]}"; do
		bin=$([ "$side" = before ] && echo "$before" || echo "$after")
		build/bench_train_step --slicetrain "$bin" "${args[@]}" >"$out/$side-$i.txt" 2>&1
		# the rows: "1    2   st fp32    4.269  500.3 ..." (rep, threads, st, mode, step s, tokens/s)
		awk -v s="$side" -v i="$i" '$3 == "st" && $1 == 1 { print i, s, $2, $4, $6 }' "$out/$side-$i.txt" >>"$out/rows"
		echo "pair $i $side: $(awk -v s="$side" -v i="$i" '$1 == i && $2 == s { printf "%s@%s %s tok/s  ", $4, $3, $5 }' "$out/rows")"
	done
done
head -3 "$out/before-1.txt" | grep -E '^cpu:' || true
/usr/bin/python3 - "$out/rows" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
tok = {(int(i), s, int(t), m): float(v) for i, s, t, m, v in rows}
keys = sorted({(m, t) for (_, _, t, m) in tok})
print("after / before, tokens/s, per pair; median and range:")
for m, t in keys:
    r = [tok[(i, "after", t, m)] / tok[(i, "before", t, m)]
         for i in sorted({k[0] for k in tok}) if (i, "after", t, m) in tok and (i, "before", t, m) in tok]
    if r:
        print(f"  {m:5s} {t} thread{'s' if t > 1 else ' '}: median {statistics.median(r):.3f} "
              f"(range {min(r):.3f}-{max(r):.3f}; {' '.join(f'{x:.3f}' for x in r)})")
PY
