# Every fuzz target (fuzz/fuzz_*.c: the network parsers and the handshake;
# fuzz/README.md) built with clang, libFuzzer, ASan and UBSan (`make fuzz`,
# in build-fuzz/, only what changed) and run FUZZ_SHORT_SECONDS (default 5)
# each from its committed seeds, on a scratch corpus: a crash, a leak, a
# sanitizer report, an input over 10 s or a failed check fails the test and
# names the reproducer (copied to build-fuzz/crashes/). The 10-minute runs
# are `make fuzz-run`. Skipped (dependency) without clang or libFuzzer
# (scripts/install-deps.sh --test installs clang, libclang-rt-14-dev,
# libomp-14-dev). It does not use the build under test: tests/run.sh runs it
# on the first build only; make check builds the targets beside the others.
# timeout: 240
# builds: first
. "$(dirname "$0")/../cli_lib.sh"
seconds=${FUZZ_SHORT_SECONDS:-5}
cd "$ST_ROOT" || exit 1
command -v "${FUZZ_CC:-clang}" >/dev/null || skip_dep "no clang (apt-get install clang)"
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return 0; }\n' >"$TMP/probe.c"
"${FUZZ_CC:-clang}" -fsanitize=fuzzer,address,undefined "$TMP/probe.c" -o "$TMP/probe" 2>"$TMP/probe.err" ||
	skip_dep "clang cannot link libFuzzer (libclang-rt-14-dev): $(head -1 "$TMP/probe.err")"
printf '#include <omp.h>\nint main(void) { return omp_get_max_threads() < 1; }\n' >"$TMP/omp.c"
"${FUZZ_CC:-clang}" -fopenmp "$TMP/omp.c" -o "$TMP/omp" 2>"$TMP/omp.err" ||
	skip_dep "clang has no OpenMP (libomp-14-dev): $(head -1 "$TMP/omp.err")"

# the tests' environment is for slicetrain: libFuzzer reports its own findings
unset ASAN_OPTIONS UBSAN_OPTIONS
if ! make -s -j2 fuzz >"$TMP/make.out" 2>&1; then
	tail -n 20 "$TMP/make.out" | sed 's/^/    /'
	fail "make fuzz failed"
	finish
fi
names=()
for s in fuzz/fuzz_*.c; do
	names+=("$(basename "$s" .c)")
done
[ ${#names[@]} -ge 2 ] || fail "only ${#names[@]} fuzz target(s) built: ${names[*]}"
echo "targets: ${names[*]}; $seconds s each"
FUZZ_CORPUS_ROOT="$TMP/corpus" FUZZ_CRASH_DIR=build-fuzz/crashes FUZZ_LOG_DIR="$TMP/logs" \
	fuzz/run.sh "$seconds" "${names[@]}" || fail "a fuzz target failed (above: its reproducer)"
finish
