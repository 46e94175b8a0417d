#!/usr/bin/env bash
# Runs every test: C test programs (<build>/tests/test_*) and shell tests
# (tests/cli/*.sh, which drive <build>/slicetrain), for each build directory
# in $BUILDS (default: build; `make check` passes "build build-san").
# An optional argument selects the tests whose name contains it; one that
# selects nothing is an error (exit 2).
#
# A test's exit status: 0 passed; 77 skipped, after printing one line
#   SKIP hardware: REASON     (this machine lacks something: always a skip)
#   SKIP dependency: REASON   (scripts/install-deps.sh --test provides it:
#                              a failure when CI=true)
# per skipped part (tests/cli_lib.sh and tests/check.h print them); anything
# else failed. A test also fails when it runs past its time limit (then its
# whole process tree is killed), when a sanitizer reports anything, when it
# leaves processes running, and, for a shell test, when it exits 0 without
# reaching cli_lib.sh's finish (its last line "ok").
# Time limit: $ST_TEST_TIMEOUT seconds if set (every test); else a line
# "timeout: SECONDS" in the first 40 lines of the test's source (tests/NAME.c:
# " * timeout: N", tests/cli/NAME.sh: "# timeout: N"), else 300; times
# $ST_SAN_TIMEOUT_SCALE (default 3) on a sanitized build.
# Ends with the skipped tests and their reasons, the failed ones, and the line
# "N passed, N failed, N skipped"; exit status 0 when none failed.
set -u
cd "$(dirname "$0")/.."
BUILDS=${BUILDS:-build}
export ST_ROOT="$PWD"
# The tests check behaviour on small models, where threads only add barrier
# waits (and oversubscription on a busy machine makes them very slow); tests
# that need threads set them themselves.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Sanitized builds: a report ends the process with status 99, which no test
# expects of slicetrain (it uses 0, 1, 2, 3 and 128+N), and ASan's reports go
# to files the runner checks even when a test tolerated the status.
SAN_EXIT=99 SKIP_EXIT=77
# a sanitizer's report in a test's output (tests/cli_lib.sh's status_is too)
export ST_SAN_REPORT='^==[0-9]+==ERROR: [A-Za-z]+Sanitizer|: runtime error: |^SUMMARY: [A-Za-z]+Sanitizer'
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}halt_on_error=1:print_stacktrace=1:exitcode=$SAN_EXIT"
asan_options="${ASAN_OPTIONS:+$ASAN_OPTIONS:}abort_on_error=0:exitcode=$SAN_EXIT"
pass=0 fail=0 skip=0 selected=0 failed=() skipped=()
logdir=$(mktemp -d "${TMPDIR:-/tmp}/slicetrain-tests.XXXXXX")
cur=0 timer=0 # the running test's session (and process group), and its timer
trap 'rm -rf "$logdir"' EXIT
trap 'echo "interrupted"; [ $cur -gt 0 ] && kill -KILL -- -$cur $timer 2>/dev/null; exit 130' INT TERM
filter=${1:-}

# The pids of the live (not zombie) processes of session $1.
session_pids() {
	local f line fields
	for f in /proc/[0-9]*/stat; do
		{ read -r line <"$f"; } 2>/dev/null || continue
		read -ra fields <<<"${line##*) }" # state ppid pgrp session ...
		[ "${fields[3]}" = "$1" ] && [ "${fields[0]}" != Z ] && echo "${f//[^0-9]/}"
	done
}

# The time limit of the test whose source is $1, on a build with time scale $scale.
time_limit() {
	[ -n "${ST_TEST_TIMEOUT:-}" ] && { echo "$ST_TEST_TIMEOUT"; return; }
	local t
	t=$(head -n 40 "$1" 2>/dev/null | sed -nE 's/^(#| \*) timeout: ([0-9]+) *$/\2/p' | head -1)
	echo $((${t:-300} * scale))
}

# run_one NAME SOURCE KIND(c|sh) COMMAND...
run_one() {
	local name=$1 src=$2 kind=$3 limit; shift 3
	[ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && return
	selected=$((selected + 1))
	limit=$(time_limit "$src")
	local out="$logdir/out" san="$logdir/san" t0=$EPOCHREALTIME rc done why="" left
	rm -rf "$san" "$logdir/tmp" && mkdir "$san" "$logdir/tmp"
	# its own session (and process group): a timeout kills all of it
	TMPDIR="$logdir/tmp" ASAN_OPTIONS="$asan_options:log_path=$san/asan" setsid "$@" >"$out" 2>&1 </dev/null &
	cur=$!
	sleep "$limit" &
	timer=$!
	wait -n -p done "$cur" "$timer"
	rc=$?
	if [ "$done" = "$cur" ]; then
		kill "$timer"; wait "$timer" 2>/dev/null
	else
		why="timeout: still running after ${limit}s; killed its process group"
		kill -TERM -- -"$cur" 2>/dev/null
		sleep 5 &
		timer=$!
		wait -n -p done "$cur" "$timer"
		if [ "$done" = "$cur" ]; then kill "$timer"; wait "$timer" 2>/dev/null; else kill -KILL -- -"$cur" 2>/dev/null; wait "$cur" 2>/dev/null; fi
		rc=124
	fi
	# whatever of its session still runs is stopped, and is a failure
	left=$(session_pids "$cur")
	if [ -n "$left" ]; then
		[ -n "$why" ] || why="left processes running: $(for p in $left; do tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-60; echo; done | paste -sd ';')"
		kill -KILL $left 2>/dev/null
	fi
	cur=0
	local reasons
	reasons=$(grep -E '^SKIP (hardware|dependency): ' "$out")
	if [ -n "$why" ]; then
		:
	elif ls "$san"/asan* >/dev/null 2>&1 || grep -qE "$ST_SAN_REPORT" "$out"; then
		why="sanitizer report (exit $rc)"
		cat "$san"/asan* >>"$out" 2>/dev/null
	elif [ $rc -eq $SAN_EXIT ]; then
		why="exit $rc (a sanitizer's)"
	elif [ $rc -eq 0 ] && [ -n "$reasons" ]; then
		why="exit 0 after printing SKIP lines (a skip exits $SKIP_EXIT)"
	elif [ $rc -eq 0 ] && [ "$kind" = sh ] && [ "$(tail -n 1 "$out")" != ok ]; then
		why="exit 0 without reaching finish (no closing \"ok\")"
	elif [ $rc -eq $SKIP_EXIT ] && [ -z "$reasons" ]; then
		why="exit $SKIP_EXIT without a SKIP line"
	elif [ $rc -eq $SKIP_EXIT ] && [ "${CI:-}" = true ] && grep -q '^SKIP dependency: ' <<<"$reasons"; then
		why="CI=true: a missing dependency is a failure: $(grep '^SKIP dependency: ' <<<"$reasons" | head -1)"
	elif [ $rc -ne 0 ] && [ $rc -ne $SKIP_EXIT ]; then
		why="exit $rc"
	fi
	local secs
	secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.2f", b-a}')
	if [ -n "$why" ]; then
		fail=$((fail + 1)); failed+=("$name")
		printf 'FAIL %-44s %7ss  %s\n' "$name" "$secs" "$why"
		sed 's/^/    /' "$out" | tail -n 40
	elif [ $rc -eq $SKIP_EXIT ]; then
		skip=$((skip + 1))
		while IFS= read -r r; do skipped+=("SKIP $name: ${r#SKIP }"); done <<<"$reasons"
		printf 'SKIP %-44s %7ss  %s\n' "$name" "$secs" "$(sed 's/^SKIP //' <<<"$reasons" | paste -sd ';')"
	else
		pass=$((pass + 1))
		printf 'PASS %-44s %7ss\n' "$name" "$secs"
	fi
	rm -rf "$logdir/tmp"
}

first=1
for b in $BUILDS; do
	[ -x "$b/slicetrain" ] || { echo "tests/run.sh: no $b/slicetrain (build it: make BUILD=$b)" >&2; exit 2; }
	case $b in /*) SLICETRAIN=$b/slicetrain ;; *) SLICETRAIN=$PWD/$b/slicetrain ;; esac
	export SLICETRAIN
	scale=1
	grep -qa __asan_init "$b/slicetrain" && scale=${ST_SAN_TIMEOUT_SCALE:-3}
	# builds after the first (the sanitized one) repeat the randomized
	# kill tests fewer times: the full counts ran on the first build
	[ $first -eq 1 ] || export KILL_REPS=${KILL_REPS_SAN:-3} CRASH_REPS=${CRASH_REPS_SAN:-3}
	first=0
	for t in "$b"/tests/test_*; do
		case "$t" in *.o|*.d) continue;; esac
		[ -x "$t" ] || continue
		n=$(basename "$t")
		run_one "$b/$n" "tests/$n.c" c "$t"
	done
	for t in tests/cli/*.sh; do
		[ -e "$t" ] || continue
		run_one "$b/cli/$(basename "$t" .sh)" "$t" sh bash "$t"
	done
done
if [ $selected -eq 0 ]; then
	echo "tests/run.sh: no test matches '$filter' (in builds: $BUILDS)" >&2
	exit 2
fi
[ ${#skipped[@]} -gt 0 ] && printf '%s\n' "${skipped[@]}"
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
