#!/usr/bin/env bash
# Prints the CPU line of a benchmark's header (issue 14: the CPU changes
# between machines, and every figure names it), as bench/bench_cpu.h does
# for the C benchmarks: "cpu: MODEL, family F model M, N logical CPUs".
set -euo pipefail
field() { sed -n "s/^$1[[:space:]]*: //p" /proc/cpuinfo | head -1; }
echo "cpu: $(field 'model name'), family $(field 'cpu family') model $(field 'model'), $(nproc) logical CPUs"
