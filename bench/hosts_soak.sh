#!/usr/bin/env bash
# No false alarms (docs/failures.md): a fault-free elastic run on test hosts
# (tests/hosts_lib.sh; 2 slices x 1 host, 1 device and 1 thread each, steps
# paced to PACE s) for DURATION seconds under
#   MODE=loss: P (default 0.05) of the packets dropped at random on every
#              host's link, the controller's too (iptables statistic: in and
#              out, so a packet between two hosts crosses two lossy links);
#   MODE=busy: slice 1's host loaded by BUSY busy processes (default 2: both
#              cores of this machine, which all test hosts share).
# Then SIGTERM to the controller. Counts the failures the controller
# declared (want 0: the summary's "failures" and no RESTARTING), and prints
# the steps trained and the median step time. Needs root; nothing is left
# behind.
#
# Usage: MODE=loss|busy bench/hosts_soak.sh [> bench/results/hosts-soak-MODE-CPU-DATE.txt]
#   DURATION (default 1800 for loss, 600 for busy), PACE (default 0.3), P,
#   BUSY, SLICETRAIN (default build/slicetrain; use a copy when rebuilding
#   meanwhile: agents of another build are refused)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLICETRAIN=${SLICETRAIN:-$ROOT/build/slicetrain}
MODE=${MODE:-loss} PACE=${PACE:-0.3} P=${P:-0.05} BUSY=${BUSY:-2}
case $MODE in loss) DURATION=${DURATION:-1800} ;; busy) DURATION=${DURATION:-600} ;;
*) echo "MODE is loss or busy, not '$MODE'" >&2; exit 2 ;; esac
[ -x "$SLICETRAIN" ] || { echo "no slicetrain at $SLICETRAIN (make first)" >&2; exit 2; }
. "$ROOT/tests/hosts_lib.sh"
. "$ROOT/tests/hosts_run_lib.sh"
hr_standalone hosts-soak

echo "bench/hosts_soak.sh: MODE=$MODE DURATION=$DURATION PACE=$PACE$([ $MODE = loss ] && echo " P=$P" || echo " BUSY=$BUSY")"
"$ROOT/bench/cpu.sh"
echo "date: $(date -u +%F' '%T) UTC, commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"
hr_up 2 1 || { echo "cannot make the test hosts"; exit 1; }
export SLICETRAIN_MIN_STEP_SECONDS=$PACE
hr_controller run --num-slices 2 --min-slices 1 --devices-per-slice 1 --max-failures -1 -- \
	"$ROOT/configs/base.yml" model_name=llama3-test per_device_batch_size=4 max_target_length=128 \
	dcn_data_parallelism=-1 checkpoint_period=200 base_output_directory="$TMP/o" steps=100000000 run_name=soak
hr_agent 0 0
hr_agent 1 0
hr_wait_steps run 3 60 || fail "the run did not start: $(tail -3 "$TMP/run.out")"
if [ $MODE = loss ]; then
	for h in ctl s0h0 s1h0; do th_drop $h "$P" || fail "cannot drop packets on $h"; done
else
	for i in $(seq "$BUSY"); do th_bg s1h0 /dev/null sh -c 'while :; do :; done'; done
fi
s0=$(hr_steps run)
t0=$(date +%s)
while [ $(($(date +%s) - t0)) -lt "$DURATION" ] && kill -0 "$hr_ctl" 2>/dev/null; do sleep 5; done
s1=$(hr_steps run)
kill -TERM "$hr_ctl"
hr_wait run 120
hr_summary run >/dev/null
restarts=$(grep -c 'RUNNING -> RESTARTING' "$TMP/run.out")
echo "steps trained under $MODE in $DURATION s: $((s1 - s0)); median step $(grep -o 'seconds: [0-9.]*' "$TMP/run.out" |
	awk '{print $2}' | sort -g | awk '{v[NR]=$1} END {printf "%.3f", NR ? v[int((NR+1)/2)] : 0}') s"
echo "failures declared: $(hr_get failures) (summary), $restarts RUNNING -> RESTARTING"
grep -E 'RESTARTING|lost:' "$TMP/run.out" | head -5
[ "$(hr_get failures)" = 0 ] && [ "$restarts" = 0 ] || fail "failures were declared"
hr_clean
echo "$failures failure(s)"
exit $((failures > 0))
