#!/usr/bin/env bash
# Builds slicetrain, test_kernels and the benchmarks for another x86-64 CPU
# (default: AVX-512 with BF16; OPT overrides) into $BUILD (build-avx512), and
# bundles them with this machine's shared libraries and loader in
# $BUILD/bundle, so that they run on a Linux machine with no build tools or
# packages of ours (the lent GPU machine's host CPU, docs/performance.md "An
# Intel Xeon with AMX"). Each program in the bundle is a wrapper script:
#   $BUILD/bundle/train_step --slicetrain $BUILD/bundle/slicetrain --no-torch
# The binaries stop with SIGILL on a CPU without the instructions OPT names.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-avx512}
OPT=${OPT:--O2 -march=x86-64-v4 -mavx512bf16 -mtune=generic}
progs=(slicetrain tests/test_kernels bench/attention bench/train_step)
make -s -j2 BUILD="$BUILD" OPT="$OPT" "${progs[@]/#/$BUILD/}"
out=$BUILD/bundle
rm -rf "$out"
mkdir -p "$out/lib"
for f in "${progs[@]}"; do
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
