#!/usr/bin/env bash
# Compiles every kernel source (src/kernels/**/*.c, or the files given) for
# every CPU target the project meets, with both compilers, whatever CPU this
# machine has: the build's own -march=native compiles only this CPU's paths,
# so a change made on one CPU could break another's build unseen (clang 14
# once crashed on amx.c in its backend, "Cannot select: intrinsic
# %llvm.x86.tilerelease", on every CPU without AMX). docs/testing.md.
#
#   scripts/kernels-compile.sh [FILE.c...]
#
# Targets (each with gcc and clang unless said):
#   avx512-bf16   gcc -march=znver4 (AVX-512 + AVX512_BF16, no AMX); gcc 12
#                 has no znver4, so there znver3 plus the AVX-512 extensions
#                 gcc 13's znver4 adds; clang 14 (no znver4 either):
#                 -march=x86-64-v4 -mavx512bf16
#   amx           -march=sapphirerapids
#   avx2          -march=x86-64-v3
#   sse4          -march=x86-64-v2
# Flags: the optimized build's (-O2, -fopenmp, the warnings) with -Werror: a
# warning on any target fails too. CC_GCC, CC_CLANG: the compilers (default
# gcc, clang). JOBS: compiles at a time (default 1).
# Prints one line per compiler and target, the first errors of each file
# that failed, and "kernels-compile: N compiled, N failed"; exit 0 when all
# compiled, 1 when any failed, 2 when a compiler or a file is missing.
set -u
cd "$(dirname "$0")/.."
gcc=${CC_GCC:-gcc} clang=${CC_CLANG:-clang} jobs=${JOBS:-1}
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "kernels-compile: JOBS='$jobs' is not a positive number" >&2; exit 2; }
for c in "$gcc" "$clang"; do
	command -v "$c" >/dev/null || { echo "kernels-compile: no compiler '$c'" >&2; exit 2; }
done
if [ $# -gt 0 ]; then
	files=("$@")
else
	mapfile -t files < <(find src/kernels -name '*.c' | sort)
fi
[ ${#files[@]} -gt 0 ] || { echo "kernels-compile: no kernel sources" >&2; exit 2; }
for f in "${files[@]}"; do
	[ -f "$f" ] || { echo "kernels-compile: no file $f" >&2; exit 2; }
done

znver4="-march=znver4"
if ! echo 'int x;' | "$gcc" $znver4 -x c -c -o /dev/null - 2>/dev/null; then
	znver4="-march=znver3 -mavx512f -mavx512cd -mavx512vl -mavx512bw -mavx512dq -mavx512ifma"
	znver4+=" -mavx512vbmi -mavx512vbmi2 -mavx512vnni -mavx512bitalg -mavx512vpopcntdq -mavx512bf16"
	znver4+=" -mgfni -mvaes -mvpclmulqdq"
	echo "kernels-compile: $("$gcc" -dumpfullversion) has no -march=znver4: znver3 plus znver4's AVX-512 extensions"
fi
# name, compiler, flags
targets=(
	"avx512-bf16|$gcc|$znver4"
	"avx512-bf16|$clang|-march=x86-64-v4 -mavx512bf16"
	"amx|$gcc|-march=sapphirerapids"
	"amx|$clang|-march=sapphirerapids"
	"avx2|$gcc|-march=x86-64-v3"
	"avx2|$clang|-march=x86-64-v3"
	"sse4|$gcc|-march=x86-64-v2"
	"sse4|$clang|-march=x86-64-v2"
)
common=(-O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Werror -fopenmp -Isrc)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kernels-compile.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# one compile: writes $tmp/T.F.rc and its diagnostics to $tmp/T.F.err
one() { # TARGET-INDEX FILE-INDEX
	local cc flags
	IFS='|' read -r _ cc flags <<<"${targets[$1]}"
	# shellcheck disable=SC2086 # flags are words
	"$cc" "${common[@]}" $flags -c "${files[$2]}" -o "$tmp/$1.$2.o" >"$tmp/$1.$2.err" 2>&1
	echo $? >"$tmp/$1.$2.rc"
	rm -f "$tmp/$1.$2.o"
}
t0=$EPOCHREALTIME
running=0
for ti in "${!targets[@]}"; do
	for fx in "${!files[@]}"; do
		one "$ti" "$fx" &
		running=$((running + 1))
		[ $running -ge "$jobs" ] && { wait -n; running=$((running - 1)); }
	done
done
wait

ok=0 bad=0
for ti in "${!targets[@]}"; do
	IFS='|' read -r name cc flags <<<"${targets[$ti]}"
	tok=0 tbad=0 failed=()
	for fx in "${!files[@]}"; do
		if [ "$(cat "$tmp/$ti.$fx.rc" 2>/dev/null)" = 0 ]; then
			tok=$((tok + 1))
		else
			tbad=$((tbad + 1)) failed+=("$fx")
		fi
	done
	printf '%-5s %-12s %2d compiled, %d failed  (%s)\n' "$(basename "$cc")" "$name" "$tok" "$tbad" "$flags"
	for fx in "${failed[@]}"; do
		echo "    FAIL ${files[$fx]} (exit $(cat "$tmp/$ti.$fx.rc" 2>/dev/null)): $cc ${common[*]} $flags"
		grep -E 'error|warning' "$tmp/$ti.$fx.err" | head -n 3 | sed 's/^/      /'
	done
	ok=$((ok + tok)) bad=$((bad + tbad))
done
echo "kernels-compile: ${#files[@]} files x ${#targets[@]} compilers and targets in" \
	"$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}') s"
echo "kernels-compile: $ok compiled, $bad failed"
[ "$bad" -eq 0 ]
