#!/usr/bin/env bash
# Builds slicetrain and bench/train_step, then runs the benchmark from the
# repository root: slicetrain's training step vs oneDNN's matmul rate vs the
# PyTorch reference, at 1 and 2 threads, and each remat policy's speed and
# peak memory vs `slicetrain plan`. Arguments go to bench/train_step
# (--threads 1,2 --steps 5 --torch-steps 2 --no-torch --no-remat).
# Takes 20-30 minutes on 2 cores, most of it in the PyTorch runs (with the
# netlib BLAS Debian installs by default, about 4 minutes per step).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
make -s -j2 BUILD="$BUILD" "$BUILD/slicetrain" "$BUILD/libslicetrain.a"
ldlibs=$(make -s --no-print-directory -f Makefile -f <(printf 'print-ldlibs:\n\t@echo $(LDLIBS)\n') print-ldlibs)
${CC:-cc} -O2 -march=native -std=c11 -D_GNU_SOURCE -Wall -Wextra -fopenmp -Isrc \
	bench/train_step.c "$BUILD/libslicetrain.a" -o "$BUILD/bench_train_step" $ldlibs
exec "$BUILD/bench_train_step" --slicetrain "$BUILD/slicetrain" "$@"
