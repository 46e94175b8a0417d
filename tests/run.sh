#!/usr/bin/env bash
# Runs every test: C test programs (<build>/tests/test_*) and shell tests
# (tests/cli/*.sh, which drive <build>/slicetrain), for each build directory
# in $BUILDS (default: build; `make check` passes "build build-san").
# Each test is one program that exits 0 on success. An optional argument
# selects tests whose name contains it. Ends with "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
BUILDS=${BUILDS:-build}
export ST_ROOT="$PWD"
# The tests check behaviour on small models, where threads only add barrier
# waits (and oversubscription on a busy machine makes them very slow); tests
# that need threads set them themselves.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
pass=0 fail=0 failed=()
logdir=$(mktemp -d "${TMPDIR:-/tmp}/slicetrain-tests.XXXXXX")
trap 'rm -rf "$logdir"' EXIT
filter=${1:-}

run_one() {
	local name=$1; shift
	[ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && return
	local t0=$EPOCHREALTIME
	"$@" >"$logdir/out" 2>&1
	local rc=$?
	if [ $rc -eq 0 ]; then
		pass=$((pass + 1))
		printf 'PASS %-44s %7.2fs\n' "$name" "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{print b-a}')"
	else
		fail=$((fail + 1)); failed+=("$name")
		printf 'FAIL %-44s (exit %d)\n' "$name" "$rc"
		sed 's/^/    /' "$logdir/out" | tail -n 40
	fi
}

first=1
for b in $BUILDS; do
	export SLICETRAIN="$PWD/$b/slicetrain"
	# builds after the first (the sanitized one) repeat the randomized
	# kill tests fewer times: the full counts ran on the first build
	[ $first -eq 1 ] || export KILL_REPS=${KILL_REPS_SAN:-3} CRASH_REPS=${CRASH_REPS_SAN:-3}
	first=0
	for t in "$b"/tests/test_*; do
		case "$t" in *.o|*.d) continue;; esac
		[ -x "$t" ] || continue
		run_one "$b/$(basename "$t")" "$t"
	done
	for t in tests/cli/*.sh; do
		[ -e "$t" ] || continue
		run_one "$b/cli/$(basename "$t" .sh)" bash "$t"
	done
done
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
