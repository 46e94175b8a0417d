#!/usr/bin/env bash
# Runs the fuzz targets built by `make fuzz` (fuzz/README.md), one after the
# other, each for SECONDS (default 600):
#   fuzz/run.sh [SECONDS] [NAME...]        (make fuzz-run FUZZ_SECONDS=N)
# Each target NAME works on its corpus ($FUZZ_CORPUS_ROOT/NAME, default
# build-fuzz/corpus/NAME: what it found is kept for the next run), read
# after its seeds fuzz/seeds/NAME/ (committed, small); fuzz/NAME.dict is its
# dictionary when there is one. A crash, a leak, a sanitizer report, an
# input that runs over 10 s or a run over 2 GiB fails the target: its
# reproducer is written to $FUZZ_CRASH_DIR (default build-fuzz/crashes) and
# named, with the command that replays it. Prints one line per target
# (executions, rate, corpus, coverage) and exits 1 when any failed.
set -u
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift $(($# > 0 ? 1 : 0))
build=${FUZZ_BUILD:-build-fuzz}
corpus_root=${FUZZ_CORPUS_ROOT:-$build/corpus}
crash_dir=${FUZZ_CRASH_DIR:-$build/crashes}
log_dir=${FUZZ_LOG_DIR:-$build/logs}
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
	for t in "$build"/fuzz_*; do
		[ -x "$t" ] && [ -f "$t" ] && names+=("$(basename "$t")")
	done
fi
[ ${#names[@]} -gt 0 ] || { echo "fuzz/run.sh: no fuzz targets in $build (make fuzz)" >&2; exit 2; }
mkdir -p "$crash_dir" "$log_dir"
failed=()
for name in "${names[@]}"; do
	bin=$build/$name
	[ -x "$bin" ] || { echo "fuzz/run.sh: no $bin (make fuzz)" >&2; failed+=("$name"); continue; }
	corpus=$corpus_root/$name
	mkdir -p "$corpus"
	args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
		-artifact_prefix="$crash_dir/$name-")
	[ -f "fuzz/$name.dict" ] && args+=(-dict="fuzz/$name.dict")
	dirs=("$corpus")
	[ -d "fuzz/seeds/$name" ] && dirs+=("fuzz/seeds/$name")
	log=$log_dir/$name.log
	"$bin" "${args[@]}" "${dirs[@]}" >"$log" 2>&1
	rc=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
	cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1)
	units=$(find "$corpus" -type f | wc -l)
	if [ $rc -eq 0 ]; then
		printf '%-16s %10s executions in %s s (%s/s), corpus %s, %s\n' "$name" "${execs:-?}" "${secs:-?}" \
			"$(awk -v e="${execs:-0}" -v s="${secs:-0}" 'BEGIN{printf "%.0f", (s > 0 ? e / s : 0)}')" "$units" "${cov:-cov: ?}"
	else
		failed+=("$name")
		artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
		echo "$name: FAILED (exit $rc) after ${execs:-?} executions; log $log"
		grep -E '^==[0-9]+==ERROR|^SUMMARY|check failed|runtime error' "$log" | head -5 | sed 's/^/    /'
		if [ -n "$artifact" ]; then
			echo "    reproducer: $artifact ($(base64 -w0 "$artifact" 2>/dev/null | cut -c1-120))"
			echo "    replay: $bin $artifact"
		else
			tail -n 20 "$log" | sed 's/^/    /'
		fi
	fi
done
[ ${#failed[@]} -eq 0 ] || { echo "fuzz/run.sh: failed: ${failed[*]}"; exit 1; }
