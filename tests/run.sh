#!/usr/bin/env bash
# Runs every test: C test programs (<build>/tests/test_*) and shell tests
# (tests/cli/*.sh, which drive <build>/slicetrain; ST_SH_DIRS: other
# directories of shell tests instead, and no C tests, e.g. tests/hosts
# for `make test-hosts`), for each build directory
# in $BUILDS (default: build; `make check` passes "build build-san
# build-noavx512:test_,cli/mesh_,..."). An entry DIR:PATTERN,PATTERN... runs
# on DIR only the tests whose name (test_kernels, cli/mesh_uneven) contains
# one of the patterns. An optional argument selects the tests whose full
# name (build/cli/mesh_uneven) contains it; one that selects nothing is an
# error (exit 2).
#
# Tests run $ST_JOBS at a time (default 1; make test / make check pass
# make's -j: `make -j2 check` runs two at a time), longest first: by the
# seconds each took in the last run on that build (<build>/tests/durations,
# written at the end of every run), else by the time limit it declares (30
# s when it declares none). Tests that mostly wait (paced steps, repair
# delays, timeouts to be detected: under a third of a core on average, from
# the CPU seconds their lines show) declare "load: light" in their header
# (tests/cli/NAME.sh: "# load: light"; tests/NAME.c: " * load: light") and
# run in a pool of their own, $ST_LIGHT_JOBS at a time (default $ST_JOBS),
# beside the others; ST_LIGHT_JOBS=0: they take the same slots as the
# rest. Each test's line is printed when it ends (with its output's last
# 40 lines after a failure), so the lines come in the order the tests end.
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
# $ST_SAN_TIMEOUT_SCALE (default 3) on a sanitized build; times
# $ST_CPU_TIMEOUT_SCALE (default 2 on a CPU without AVX-512, whose kernels
# run about half as fast: the elastic tests took up to 165 of their 200 s on
# a 2-core Zen 3; else 1) on every build.
# A test whose header has a line "builds: first" (tests/cli/NAME.sh:
# "# builds: first"; tests/NAME.c: " * builds: first") runs on the first
# build of $BUILDS only (it does not depend on the build: fuzz_short); one
# with "builds: sanitized" on the first sanitized build of $BUILDS, or the
# first build when none is (elastic_soak_short: its workers are the
# optimized build's either way); one with "builds: optimized" on the builds
# that are not sanitized (the parity tests against Python peers: what they
# check is numbers, and their time goes to the peer).
# Each test's line has its seconds and its processes' CPU seconds. Ends with
# the skipped tests and their reasons, the 10 slowest tests, the wall time
# and CPU seconds, the failed tests, and the line "N passed, N failed, N skipped";
# exit status 0 when none failed.
set -u
cd "$(dirname "$0")/.."
BUILDS=${BUILDS:-build}
JOBS=${ST_JOBS:-1}
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || { echo "tests/run.sh: ST_JOBS='$JOBS' is not a positive number" >&2; exit 2; }
LIGHT_JOBS=${ST_LIGHT_JOBS:-$JOBS}
[[ "$LIGHT_JOBS" =~ ^[0-9]+$ ]] || { echo "tests/run.sh: ST_LIGHT_JOBS='$LIGHT_JOBS' is not a number" >&2; exit 2; }
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
pass=0 fail=0 skip=0 failed=() skipped=()
logdir=$(mktemp -d "${TMPDIR:-/tmp}/slicetrain-tests.XXXXXX")
trap 'rm -rf "$logdir"' EXIT
filter=${1:-}
t_start=$EPOCHREALTIME

# The pids of the live (not zombie) processes of session $1.
session_pids() {
	local f line fields
	for f in /proc/[0-9]*/stat; do
		{ read -r line <"$f"; } 2>/dev/null || continue
		read -ra fields <<<"${line##*) }" # state ppid pgrp session ...
		[ "${fields[3]}" = "$1" ] && [ "${fields[0]}" != Z ] && echo "${f//[^0-9]/}"
	done
}

# The time limit of the test whose source is $1, on a build with time scale $2.
time_limit() {
	[ -n "${ST_TEST_TIMEOUT:-}" ] && { echo "$ST_TEST_TIMEOUT"; return; }
	local t
	t=$(head -n 40 "$1" 2>/dev/null | sed -nE 's/^(#| \*) timeout: ([0-9]+) *$/\2/p' | head -1)
	echo $((${t:-300} * $2))
}

# run_one DIR NAME LIMIT KIND(c|sh) COMMAND...: runs one test in its own
# session with the scratch directory DIR (its output, sanitizer logs, TMPDIR);
# writes DIR/line (its line, and its output's tail after a failure), DIR/status
# (pass, fail or skip) and DIR/skips (its SKIP lines). Runs in a subshell of
# its own (one per running test): TERM stops the test's whole session.
run_one() {
	local dir=$1 name=$2 limit=$3 kind=$4; shift 4
	local out="$dir/out" san="$dir/san" t0=$EPOCHREALTIME rc done why="" left cur=0 timer=0
	mkdir -p "$san" "$dir/tmp"
	trap '[ $cur -gt 0 ] && kill -KILL -- -$cur $timer 2>/dev/null; exit 130' TERM INT
	# its own session (and process group): a timeout kills all of it
	TMPDIR="$dir/tmp" ASAN_OPTIONS="$asan_options:log_path=$san/asan" setsid "$@" >"$out" 2>&1 </dev/null &
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
	local secs cpu
	secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.2f", b-a}')
	# the CPU seconds of its processes (those reaped: the test waits for its own)
	times >"$dir/times" # (in this shell: a command substitution's children are not the test)
	cpu=$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] } printf "%.1f", t }' "$dir/times")
	echo "$secs $cpu" >"$dir/secs"
	if [ -n "$why" ]; then
		printf 'FAIL %-44s %7ss %7s cpu  %s\n' "$name" "$secs" "$cpu" "$why"
		# the failed checks first (other processes' output may bury them), then the tail
		grep -E 'CHECK(_NEAR)? failed' "$out" | head -n 20 | sed 's/^/    check: /'
		sed 's/^/    /' "$out" | tail -n 40
		echo fail >"$dir/status"
	elif [ $rc -eq $SKIP_EXIT ]; then
		printf 'SKIP %-44s %7ss %7s cpu  %s\n' "$name" "$secs" "$cpu" "$(sed 's/^SKIP //' <<<"$reasons" | paste -sd ';')"
		printf '%s\n' "$reasons" >"$dir/skips"
		echo skip >"$dir/status"
	else
		printf 'PASS %-44s %7ss %7s cpu\n' "$name" "$secs" "$cpu"
		echo pass >"$dir/status"
	fi >"$dir/line"
	rm -rf "$dir/tmp"
}

# The queue: every selected test of every build; then ordered longest first (stable: ties keep this order).
q_name=() q_src=() q_kind=() q_build=() q_cmd=() q_cost=() q_light=()
add() { # add NAME SOURCE KIND BUILD PROGRAM (a shell test's: bash SOURCE)
	[ -n "$filter" ] && [[ "$1" != *"$filter"* ]] && return
	case $(head -n 40 "$2" 2>/dev/null | sed -nE 's/^(#| \*) builds: ([a-z]+) *$/\2/p' | head -1) in
	first) [ "${b_first[$4]}" = 1 ] || return 0 ;;
	sanitized) [ "$4" = "${san_build:-${builds[0]}}" ] || return 0 ;;
	optimized) [ "${b_san[$4]}" = 0 ] || return 0 ;;
	esac
	if [ -n "${b_select[$4]}" ]; then
		local p ok=0
		for p in ${b_select[$4]//,/ }; do [[ "${1#"$4"/}" == *"$p"* ]] && ok=1; done
		[ $ok = 1 ] || return 0
	fi
	local cost
	cost=$(awk -v n="$1" '$1 == n { c = $2 } END { print c }' "$4/tests/durations" 2>/dev/null)
	# never run here: the time limit it declares (tests that declare one are
	# the long ones), else 30 s, times the build's time scale
	[ -n "$cost" ] || cost=$(($(head -n 40 "$2" | sed -nE 's/^(#| \*) timeout: ([0-9]+) *$/\2/p' | head -1 | grep . || echo 30) * ${b_scale[$4]}))
	local light=0
	[ "$LIGHT_JOBS" -gt 0 ] && head -n 40 "$2" | grep -qE '^(#| \*) load: light *$' && light=1
	q_name+=("$1") q_src+=("$2") q_kind+=("$3") q_build+=("$4") q_cmd+=("$5") q_cost+=("$cost") q_light+=("$light")
}
declare -A b_scale b_slicetrain b_first b_select b_san
first=1 builds=() san_build=
for entry in $BUILDS; do
	[ -z "$san_build" ] && grep -qa __asan_init "${entry%%:*}/slicetrain" 2>/dev/null && san_build=${entry%%:*}
done
cpu_scale=${ST_CPU_TIMEOUT_SCALE:-}
[ -n "$cpu_scale" ] || { grep -qw avx512f /proc/cpuinfo && cpu_scale=1 || cpu_scale=2; }
for entry in $BUILDS; do
	b=${entry%%:*}
	builds+=("$b")
	b_select[$b]=
	[ "$b" = "$entry" ] || b_select[$b]=${entry#*:}
	[ -x "$b/slicetrain" ] || { echo "tests/run.sh: no $b/slicetrain (build it: make BUILD=$b)" >&2; exit 2; }
	case $b in /*) b_slicetrain[$b]=$b/slicetrain ;; *) b_slicetrain[$b]=$PWD/$b/slicetrain ;; esac
	b_scale[$b]=$cpu_scale b_san[$b]=0
	grep -qa __asan_init "$b/slicetrain" && b_scale[$b]=$((${ST_SAN_TIMEOUT_SCALE:-3} * cpu_scale)) b_san[$b]=1
	b_first[$b]=$first
	for t in "$b"/tests/test_*; do
		[ -z "${ST_SH_DIRS:-}" ] || break # shell tests of other directories only
		case "$t" in *.o|*.d) continue;; esac
		[ -x "$t" ] || continue
		n=$(basename "$t")
		add "$b/$n" "tests/$n.c" c "$b" "$t"
	done
	for d in ${ST_SH_DIRS:-tests/cli}; do
		for t in "$d"/*.sh; do
			[ -e "$t" ] || continue
			add "$b/$(basename "$d")/$(basename "$t" .sh)" "$t" sh "$b" bash
		done
	done
	first=0
done
if [ ${#q_name[@]} -eq 0 ]; then
	echo "tests/run.sh: no test matches '$filter' (in builds: $BUILDS)" >&2
	exit 2
fi
mapfile -t order < <(for i in "${!q_name[@]}"; do echo "$i ${q_cost[$i]}"; done | sort -s -k2,2gr | cut -d' ' -f1)
nlight=0
for i in "${order[@]}"; do nlight=$((nlight + q_light[i])); done
echo "tests/run.sh: ${#order[@]} tests, $JOBS at a time$([ "$nlight" -gt 0 ] &&
	echo " and $LIGHT_JOBS of the $nlight light ones beside them"), builds: ${builds[*]}"

# start I: test I of the queue in the background, in its scratch directory
declare -A running=() # pid -> queue index
busy=(0 0)            # running tests: ordinary, light
start() {
	local i=$1 b=${q_build[$1]} dir="$logdir/$1"
	mkdir -p "$dir"
	(
		export SLICETRAIN=${b_slicetrain[$b]}
		# builds after the first (the sanitized one) repeat the randomized
		# kill tests fewer times: the full counts ran on the first build
		[ "${b_first[$b]}" = 1 ] || export KILL_REPS=${KILL_REPS_SAN:-3} CRASH_REPS=${CRASH_REPS_SAN:-3}
		local cmd=("${q_cmd[$1]}")
		[ "${q_kind[$1]}" = sh ] && cmd=(bash "${q_src[$1]}")
		run_one "$dir" "${q_name[$1]}" "$(time_limit "${q_src[$1]}" "${b_scale[$b]}")" "${q_kind[$1]}" "${cmd[@]}"
	) &
	running[$!]=$i
	busy[q_light[i]]=$((busy[q_light[i]] + 1))
}
# collect: waits for one running test to end and prints its line
collect() {
	local pid i dir
	wait -n -p pid "${!running[@]}"
	i=${running[$pid]}
	unset "running[$pid]"
	busy[q_light[i]]=$((busy[q_light[i]] - 1))
	dir="$logdir/$i"
	cat "$dir/line" 2>/dev/null || echo "FAIL ${q_name[$i]}  (the runner lost its result)"
	case $(cat "$dir/status" 2>/dev/null) in
	pass) pass=$((pass + 1)) ;;
	skip)
		skip=$((skip + 1))
		while IFS= read -r r; do skipped+=("SKIP ${q_name[$i]}: ${r#SKIP }"); done <"$dir/skips"
		;;
	*) fail=$((fail + 1)); failed+=("${q_name[$i]}") ;;
	esac
	echo "${q_name[$i]} $(cat "$dir/secs" 2>/dev/null || echo 0 0)" >>"$logdir/times"
	rm -rf "$dir"
}
trap 'echo "interrupted"; for p in "${!running[@]}"; do kill -TERM "$p" 2>/dev/null; done; wait; exit 130' INT TERM

# the first test of the queue whose pool has a free slot starts; when none
# has one, the next test to end frees one
cap=("$JOBS" "$LIGHT_JOBS")
queue=("${order[@]}")
while [ ${#queue[@]} -gt 0 ]; do
	next=-1
	for k in "${!queue[@]}"; do
		i=${queue[k]}
		[ "${busy[q_light[i]]}" -lt "${cap[q_light[i]]}" ] && { next=$k; break; }
	done
	if [ "$next" -lt 0 ]; then
		collect
		continue
	fi
	start "${queue[next]}"
	unset "queue[next]"
	queue=("${queue[@]}")
done
while [ ${#running[@]} -gt 0 ]; do collect; done

# each build's durations, for the next run's order (a partial run updates its tests)
for b in "${builds[@]}"; do
	f="$b/tests/durations"
	[ -d "$b/tests" ] || continue
	{ awk -v p="$b/" 'index($1, p) == 1' "$logdir/times"; [ -f "$f" ] && cat "$f"; } | awk '!seen[$1]++' | sort >"$f.tmp" && mv "$f.tmp" "$f"
done
[ ${#skipped[@]} -gt 0 ] && printf '%s\n' "${skipped[@]}"
echo "the 10 slowest (seconds, CPU seconds):"
sort -k2,2gr "$logdir/times" | head -10 | awk '{ printf "  %7.1f %7.1f  %s\n", $2, $3, $1 }'
echo "tests/run.sh: $(awk -v a="$t_start" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.0f", b-a}') s wall," \
	"$(awk '{ t += $3 } END { printf "%.0f", t }' "$logdir/times") CPU seconds in tests, $JOBS at a time" \
	"(and $LIGHT_JOBS light);" \
	"load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
