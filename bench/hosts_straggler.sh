#!/usr/bin/env bash
# A slow host across test hosts (network namespaces: tests/hosts_lib.sh),
# throttled with the cgroup v1 cpu controller: 2 slices x 1 host (x 1
# device, 1 thread), steps not paced (llama3-test, BATCH x 512 tokens a
# device: each worker computes most of the time). For each fraction F of
# FRACTIONS, in a run of its own, with and without --evict-stragglers:
# slice 1's worker's CPU use is measured over 3 s (u cores), then it is put
# in a cgroup of its own with cpu.cfs_quota_us = F x u x the period; the
# slowdown measured is the median step time while throttled over the one
# before. Reported: the steps from the throttle to the controller's "is
# slow" line (the target: at most 10), the step time without eviction, and
# with eviction the median step time of steps 5-20 after detection on the
# slice left, against the same run's 1-slice steps after a kill (--kill) of
# slice 1 without throttling. Needs root and /sys/fs/cgroup/cpu (v1).
# Nothing is left behind (the cgroup removed).
#
# Usage: bench/hosts_straggler.sh [> bench/results/hosts-straggler-CPU-DATE.txt]
#   FRACTIONS (default "0.7 0.5"), BATCH (default 16), STEPS (default 160),
#   SLICETRAIN (default build/slicetrain)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLICETRAIN=${SLICETRAIN:-$ROOT/build/slicetrain}
FRACTIONS=${FRACTIONS:-0.7 0.5} BATCH=${BATCH:-16} STEPS=${STEPS:-160}
CG=/sys/fs/cgroup/cpu
[ -x "$SLICETRAIN" ] || { echo "no slicetrain at $SLICETRAIN (make first)" >&2; exit 2; }
[ -w "$CG" ] || { echo "no writable cgroup v1 cpu controller at $CG" >&2; exit 2; }
. "$ROOT/tests/hosts_lib.sh"
. "$ROOT/tests/hosts_run_lib.sh"
hr_standalone hosts-straggler
cgroup=$CG/slicetrain-bench-$$
cleanup_cg() { [ -d "$cgroup" ] && { cat "$cgroup/cgroup.procs" 2>/dev/null | while read -r p; do echo "$p" >"$CG/cgroup.procs"; done; rmdir "$cgroup"; }; }
trap 'cleanup_cg; rm -rf "$TMP"' EXIT

echo "bench/hosts_straggler.sh: FRACTIONS='$FRACTIONS' BATCH=$BATCH STEPS=$STEPS"
"$ROOT/bench/cpu.sh"
echo "date: $(date -u +%F' '%T) UTC, commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"

keys=("$ROOT/configs/base.yml" model_name=llama3-test per_device_batch_size="$BATCH" max_target_length=512
	checkpoint_period=1000 dcn_data_parallelism=-1 base_output_directory="$TMP/o" steps=$STEPS)
hr_up 2 1 || { echo "cannot make the test hosts"; exit 1; }
cpu_s() { awk '{print ($14 + $15) / 100}' "/proc/$1/stat"; } # utime + stime, s (USER_HZ 100)
step_times() { sed -n 's/^completed step: \([0-9]*\), seconds: \([0-9.]*\),.*/\1 \2/p' "$TMP/$1.out"; }
median_of() { sort -g | awk '{v[NR]=$1} END {print NR ? (NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2) : 0}'; }
median_steps() { step_times "$1" | awk -v a="$2" -v b="$3" '$1 >= a && $1 < b {print $2}' | median_of; }

# the 1-slice step time without throttling: slice 1 killed at step 20
hr_controller ref1 --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 3600 --kill 1@20 -- \
	"${keys[@]}" run_name=ref1 steps=60
hr_agent 0 0
hr_agent 1 0
hr_wait ref1 300
one=$(median_steps ref1 30 60)
echo "fault-free steps on 1 slice (after a kill of slice 1): median $one s"
kill "${hr_apid[0.0]}" "${hr_apid[1.0]}" 2>/dev/null
wait "${hr_apid[0.0]}" "${hr_apid[1.0]}" 2>/dev/null

for f in $FRACTIONS; do
	for evict in no yes; do
		name=f${f/./}$evict
		opts=(--num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 3600)
		[ $evict = yes ] && opts+=(--evict-stragglers)
		hr_controller "$name" "${opts[@]}" -- "${keys[@]}" run_name="$name"
		hr_agent 0 0
		hr_agent 1 0
		hr_wait_steps "$name" 10 120 || { fail "$name: no steps"; break 2; }
		w=$(hr_worker 1 0)
		c0=$(cpu_s "$w") t0=$(date +%s.%N)
		sleep 3
		u=$(echo "($(cpu_s "$w") - $c0) / ($(date +%s.%N) - $t0)" | bc -l)
		s0=$(hr_steps "$name")
		mkdir "$cgroup" && echo 100000 >"$cgroup/cpu.cfs_period_us" &&
			printf '%d\n' "$(echo "$f * $u * 100000" | bc -l | cut -d. -f1)" >"$cgroup/cpu.cfs_quota_us" &&
			echo "$w" >"$cgroup/cgroup.procs" || { fail "$name: cannot throttle"; break 2; }
		base=$(median_steps "$name" $((s0 - 10)) "$s0")
		det=-
		if hr_wait_line "$name" 'slice 1 host 0 is slow' 60; then
			det=$(($(grep -n 'slice 1 host 0 is slow' "$TMP/$name.out" | head -1 | cut -d: -f1)))
			det=$(head -n "$det" "$TMP/$name.out" | grep -c 'completed step')
			det=$((det - s0))
		fi
		sleep 6
		slow=$(median_steps "$name" $((s0 + 2)) $((s0 + 14)))
		printf '%s of its CPU (%.2f cores before): step %.3f s -> %.3f s (%.2fx); reported slow after %s steps' \
			"$f" "$u" "$base" "$slow" "$(echo "$slow / $base" | bc -l)" "$det"
		if [ $evict = yes ] && [ "$det" != - ]; then
			d=$((s0 + det))
			after=$(median_steps "$name" $((d + 5)) $((d + 20)))
			printf '; evicted: steps %d-%d after it %.3f s, %.2fx the fault-free 1-slice step' 5 20 "$after" \
				"$(echo "$after / $one" | bc -l)"
		fi
		echo " (--evict-stragglers: $evict)"
		cleanup_cg
		kill -TERM "$hr_ctl" 2>/dev/null
		hr_wait "$name" 60
		kill "${hr_apid[0.0]}" "${hr_apid[1.0]}" 2>/dev/null
		wait "${hr_apid[0.0]}" "${hr_apid[1.0]}" 2>/dev/null
	done
done
hr_clean
echo "$failures failure(s)"
exit $((failures > 0))
