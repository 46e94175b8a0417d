#!/usr/bin/env bash
# make test-ray: the Ray and Kubernetes tests (docs/ray.md), opt-in: they
# need .venv-ray (bash scripts/install-deps.sh --ray) and start real local
# Ray clusters (a few minutes each). Runs tests/ray/*.sh (or those whose
# name contains $1) against $BUILD/slicetrain (default build), each in its
# own session with a time limit ("# timeout: N" in its first 40 lines), and
# prints each test's whole output: what it checked and measured.
# A test passes when it exits 0 after its closing "ok" and leaves no process
# of its session running. Ends with "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
export ST_ROOT=$PWD SLICETRAIN=$PWD/$BUILD/slicetrain ST_RAY_VENV=${ST_RAY_VENV:-$PWD/.venv-ray}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
[ -x "$SLICETRAIN" ] || { echo "tests/ray/run.sh: no $SLICETRAIN (make BUILD=$BUILD)" >&2; exit 2; }
if ! "$ST_RAY_VENV/bin/python" -c "import ray, ray.train, kubernetes_validate, jsonschema" 2>/dev/null; then
	echo "tests/ray/run.sh: no Ray venv in $ST_RAY_VENV: bash scripts/install-deps.sh --ray" >&2
	exit 2
fi
filter=${1:-}
pass=0 fail=0 failed=()
logdir=$(mktemp -d)
trap 'rm -rf "$logdir"' EXIT

# The live pids of session $1.
session_pids() {
	local f line fields
	for f in /proc/[0-9]*/stat; do
		{ read -r line <"$f"; } 2>/dev/null || continue
		read -ra fields <<<"${line##*) }"
		[ "${fields[3]}" = "$1" ] && [ "${fields[0]}" != Z ] && echo "${f//[^0-9]/}"
	done
}

for t in tests/ray/*.sh; do
	name=$(basename "$t" .sh)
	[ "$name" = lib ] || [ "$name" = run ] && continue
	[ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
	limit=$(head -n 40 "$t" | sed -nE 's/^# timeout: ([0-9]+) *$/\1/p' | head -1)
	limit=${limit:-300}
	echo "---- ray/$name"
	t0=$SECONDS
	setsid bash "$t" >"$logdir/out" 2>&1 </dev/null &
	pid=$!
	( sleep "$limit"; kill -TERM -- -"$pid" 2>/dev/null; sleep 10; kill -KILL -- -"$pid" 2>/dev/null ) &
	timer=$!
	wait "$pid"
	rc=$?
	kill "$timer" 2>/dev/null
	wait "$timer" 2>/dev/null
	why=""
	left=$(session_pids "$pid")
	if [ -n "$left" ]; then
		why="left processes running: $(for p in $left; do tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-60; echo; done | paste -sd ';')"
		kill -KILL $left 2>/dev/null
	fi
	[ $((SECONDS - t0)) -ge "$limit" ] && why="timeout: still running after ${limit}s"
	[ -z "$why" ] && [ $rc -ne 0 ] && why="exit $rc"
	[ -z "$why" ] && [ "$(tail -n 1 "$logdir/out")" != ok ] && why="exit 0 without its closing \"ok\""
	sed 's/^/    /' "$logdir/out"
	if [ -n "$why" ]; then
		fail=$((fail + 1)); failed+=("ray/$name")
		printf 'FAIL %-30s %5ss  %s\n' "ray/$name" $((SECONDS - t0)) "$why"
	else
		pass=$((pass + 1))
		printf 'PASS %-30s %5ss\n' "ray/$name" $((SECONDS - t0))
	fi
done
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
