#!/usr/bin/env bash
# Builds slicetrain and bench/train_step, then runs the benchmark from the
# repository root: slicetrain's training step vs oneDNN's matmul rate vs PyPI
# PyTorch 2.x (bench/torch_peer.py in .venv-bench, created by
# scripts/install-deps.sh --bench: eager, torch.compile, bf16 autocast), at 1
# and 2 threads, 3 interleaved repetitions with medians and ratios, then each
# remat policy's speed and peak memory vs `slicetrain plan`. Arguments go to
# bench/train_step (--threads 1,2 --reps 3 --steps 5 --peer-steps 4
# --peer-warmup 2 --peer-modes eager,compile,bf16,compile-bf16 --no-torch
# --no-remat). Over an hour on 2 shared cores (the first torch.compile of
# each mode takes minutes; later repetitions hit inductor's cache, which
# lives in the run's temporary directory and goes with it).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
make -s -j2 BUILD="$BUILD" "$BUILD/slicetrain" "$BUILD/libslicetrain.a"
ldlibs=$(make -s --no-print-directory -f Makefile -f <(printf 'print-ldlibs:\n\t@echo $(LDLIBS)\n') print-ldlibs)
${CC:-cc} -O2 -march=native -std=c11 -D_GNU_SOURCE -Wall -Wextra -fopenmp -Isrc \
	bench/train_step.c "$BUILD/libslicetrain.a" -o "$BUILD/bench_train_step" $ldlibs -lm
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' (src/ modified)')"
else
	commit="${COMMIT:-? (not a git work tree)}"
fi
echo "commit: $commit; $(date -u '+%Y-%m-%d %H:%M UTC'); uptime:$(uptime)"
exec "$BUILD/bench_train_step" --slicetrain "$BUILD/slicetrain" "$@"
