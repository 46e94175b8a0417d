#!/usr/bin/env bash
# Builds slicetrain, test_kernels and the benchmarks for another x86-64 CPU
# (default: AVX-512 with BF16; OPT overrides) into $BUILD (build-avx512), and
# bundles them with this machine's shared libraries and loader in
# $BUILD/bundle, so that they run on a Linux machine with no build tools or
# packages of ours (a lent machine's host CPU; docs/performance.md). Each
# program in the bundle is a wrapper script:
#   $BUILD/bundle/train_step --slicetrain $BUILD/bundle/slicetrain --no-torch
# The binaries stop with SIGILL on a CPU without the instructions OPT names.
# PERF=1 also bundles this machine's perf and keeps slicetrain's symbols (for
# `perf record` there); the bundle is then packed as $BUILD/bundle.tar.gz,
# which fits what the device tool carries (64 MiB), to unpack on arrival.
# MPI=1 bundles bench/collectives, bench/mpi_allreduce and this machine's
# OpenMPI instead (an `mpirun` wrapper that relocates it with OPAL_PREFIX;
# put the bundle first in PATH), also packed as $BUILD/bundle.tar.gz:
#   PATH=$PWD/bundle:$PATH bundle/collectives -n 2 -m shm --mpi bundle/mpi_allreduce
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-avx512}
OPT=${OPT:--O2 -march=x86-64-v4 -mavx512bf16 -mtune=generic}
PERF=${PERF:-0}
MPI=${MPI:-0}
for v in "$PERF" "$MPI"; do
	[ "$v" = 0 ] || [ "$v" = 1 ] || { echo "portable.sh: PERF and MPI take 0 or 1, not '$v'" >&2; exit 2; }
done
progs=(slicetrain tests/test_kernels bench/attention bench/train_step)
[ "$MPI" = 1 ] && progs=(bench/collectives bench/mpi_allreduce)
make -s -j2 BUILD="$BUILD" OPT="$OPT" "${progs[@]/#/$BUILD/}"
out=$BUILD/bundle
bundle_libs() { ldd "$1" | awk '/=> \// {print $3}' | while read -r lib; do cp -L "$lib" "$out/lib/"; done; }
wrapper() {
	printf '#!/bin/sh\nd=$(cd "$(dirname "$0")" && pwd)\nexec "$d/lib/ld-linux-x86-64.so.2" --library-path "$d/lib" "$d/%s.bin" "$@"\n' \
		"$1" >"$out/$1"
	chmod +x "$out/$1"
}
rm -rf "$out"
mkdir -p "$out/lib"
for f in "${progs[@]}"; do
	name=$(basename "$f")
	cp "$BUILD/$f" "$out/$name.bin"
	if [ "$PERF" != 1 ] || [ "$name" != slicetrain ]; then strip "$out/$name.bin"; fi
	bundle_libs "$BUILD/$f"
	wrapper "$name"
done
if [ "$PERF" = 1 ]; then
	perf=$(command -v perf) || { echo "portable.sh: PERF=1 needs perf (apt-get install linux-perf)" >&2; exit 1; }
	cp -L "$perf" "$out/perf.bin"
	bundle_libs "$perf"
	wrapper perf
fi
if [ "$MPI" = 1 ]; then
	# OpenMPI finds its plugins and help files under OPAL_PREFIX (Debian's
	# prefix /usr replaced). PMIx still looks for its few plugins at
	# Debian's path; without them it warns that it has no compression,
	# which the benches do not use.
	mpi=$out/ompi
	mkdir -p "$mpi/lib/x86_64-linux-gnu" "$mpi/share"
	cp -a /usr/lib/x86_64-linux-gnu/openmpi "$mpi/lib/x86_64-linux-gnu/"
	cp -a /usr/share/openmpi "$mpi/share/"
	for so in "$mpi"/lib/x86_64-linux-gnu/*/lib/*/*.so; do bundle_libs "$so"; done
	cp -L "$(command -v orterun)" "$out/orterun.bin"
	bundle_libs "$out/orterun.bin"
	printf '#!/bin/sh\nd=$(cd "$(dirname "$0")" && pwd)\nexport OPAL_PREFIX="$d/ompi"\nexec "$d/lib/ld-linux-x86-64.so.2" --library-path "$d/lib" "$d/orterun.bin" "$@"\n' >"$out/mpirun"
	chmod +x "$out/mpirun"
fi
cp -L /lib64/ld-linux-x86-64.so.2 "$out/lib/"
if [ "$PERF" = 1 ] || [ "$MPI" = 1 ]; then
	tar -C "$BUILD" -czf "$BUILD/bundle.tar.gz" bundle
	echo "$BUILD/bundle.tar.gz: $(du -sh "$BUILD/bundle.tar.gz" | cut -f1) (OPT=$OPT, PERF=$PERF MPI=$MPI)"
	exit 0
fi
echo "$out: $(du -sh "$out" | cut -f1) (OPT=$OPT)"
