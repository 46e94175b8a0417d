# Every kernel source (src/kernels/) compiles, -Werror, for every CPU target
# with both compilers, whatever CPU runs the suite
# (scripts/kernels-compile.sh: gcc and clang at AVX-512 + AVX512_BF16 without
# AMX, with AMX, AVX2 and SSE4; docs/testing.md). The builds under test
# compile only this machine's paths (-march=native). Skipped (dependency)
# without clang (scripts/install-deps.sh --test installs it). It does not use
# the build under test: tests/run.sh runs it on the first build only.
# timeout: 120
# builds: first
. "$(dirname "$0")/../cli_lib.sh"
cd "$ST_ROOT" || exit 1
command -v "${CC_CLANG:-clang}" >/dev/null || skip_dep "no clang (apt-get install clang)"
command -v "${CC_GCC:-gcc}" >/dev/null || skip_dep "no gcc (apt-get install gcc)"
nfiles=$(find src/kernels -name '*.c' | wc -l)
[ "$nfiles" -ge 8 ] || fail "only $nfiles kernel sources under src/kernels"
bash scripts/kernels-compile.sh >"$TMP/out" 2>&1
rc=$?
cat "$TMP/out"
status_is "kernels-compile" $rc 0 "$TMP/out"
# every file on every one of the 8 compiler and target pairs
grep -qx "kernels-compile: $((nfiles * 8)) compiled, 0 failed" "$TMP/out" ||
	fail "want $((nfiles * 8)) compiles of $nfiles files, 0 failed: $(tail -n 1 "$TMP/out")"
finish
