#!/usr/bin/env bash
# Builds slicetrain, test_kernels and the benchmarks for another x86-64 CPU
# (default: AVX-512 with BF16; OPT overrides) into $BUILD (build-avx512), and
# bundles them with this machine's shared libraries and loader in
# $BUILD/bundle, so that they run on a Linux machine with no build tools or
# packages of ours (the lent GPU machine's host CPU, docs/performance.md "An
# Intel Xeon with AMX"). Each program in the bundle is a wrapper script:
#   $BUILD/bundle/bench_train_step --slicetrain $BUILD/bundle/slicetrain --no-torch
# The binaries stop with SIGILL on a CPU without the instructions OPT names.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-avx512}
OPT=${OPT:--O2 -march=x86-64-v4 -mavx512bf16 -mtune=generic}
make -s -j2 BUILD="$BUILD" OPT="$OPT" "$BUILD/slicetrain" "$BUILD/libslicetrain.a" \
	"$BUILD/tests/test_kernels" "$BUILD/bench/attention"
ldlibs=$(make -s --no-print-directory -f Makefile -f <(printf 'print-ldlibs:\n\t@echo $(LDLIBS)\n') print-ldlibs)
# shellcheck disable=SC2086 # OPT and ldlibs are lists of flags
${CC:-cc} $OPT -std=c11 -D_GNU_SOURCE -Wall -Wextra -fopenmp -Isrc bench/train_step.c \
	"$BUILD/libslicetrain.a" -o "$BUILD/bench_train_step" $ldlibs -lm
out=$BUILD/bundle
rm -rf "$out"
mkdir -p "$out/lib"
for f in slicetrain tests/test_kernels bench/attention bench_train_step; do
	name=$(basename "$f")
	cp "$BUILD/$f" "$out/$name.bin"
	strip "$out/$name.bin"
	ldd "$BUILD/$f" | awk '/=>/ {print $3}' | while read -r lib; do cp -L "$lib" "$out/lib/"; done
	printf '#!/bin/sh\nd=$(cd "$(dirname "$0")" && pwd)\nexec "$d/lib/ld-linux-x86-64.so.2" --library-path "$d/lib" "$d/%s.bin" "$@"\n' \
		"$name" >"$out/$name"
	chmod +x "$out/$name"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$out/lib/"
echo "$out: $(du -sh "$out" | cut -f1) (OPT=$OPT)"
