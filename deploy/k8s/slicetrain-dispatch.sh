#!/bin/sh
# /usr/local/bin/slicetrain in the image (deploy/k8s/Dockerfile): runs the
# build of slicetrain that this node's CPU can run fastest. slicetrain's own
# vector kernels are chosen when it is compiled (AVX-512 or portable C);
# oneDNN, which does the matrix products, picks its kernels at run time on
# any build. So the image holds three builds and this picks one per process:
#   avx512bf16  -march=x86-64-v4 -mavx512bf16   CPUs with AVX512_BF16
#   avx512      -march=x86-64-v4                AVX-512 F/BW/DQ/VL
#   x86-64-v2   -march=x86-64-v2                any x86-64 since ~2009 (SSE4.2, POPCNT)
# SLICETRAIN_VARIANT=NAME forces one (e.g. x86-64-v2 to compare).
dir=${SLICETRAIN_DISPATCH_DIR:-/opt/slicetrain/bin} # (another directory: for tests)
v=${SLICETRAIN_VARIANT:-}
if [ -z "$v" ]; then
	flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
	has() { case " $flags " in *" $1 "*) return 0 ;; esac; return 1; }
	v=x86-64-v2
	if has avx512f && has avx512bw && has avx512dq && has avx512vl; then
		v=avx512
		has avx512_bf16 && v=avx512bf16
	fi
fi
exec "$dir/slicetrain-$v" "$@"
