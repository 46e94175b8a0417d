# The launcher when one of its workers dies: SIGKILL of a random worker of
# `slicetrain launch` (2 slices x 2 devices) at a random moment of training.
# The launcher must exit with status 3 (a peer of the worker group failed)
# within 10 s, and no process of the group may remain: neither the launcher
# nor any of its workers. Repetitions: $KILL_REPS (default 5).
. "$(dirname "$0")/../cli_lib.sh"
reps=${KILL_REPS:-5}
world=4

# A process is named by pid and start time (field 22 of /proc/PID/stat), so
# that a pid reused by an unrelated process is never taken for ours.
start_time() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) && s=${s##*) } && set -- $s && echo "${20}"; }
alive() { [ "$(start_time "$1")" = "$2" ]; }
procs=() # "pid start_time" of every process started in this repetition
stop_leftovers() {
	local p
	for p in "${procs[@]}"; do
		set -- $p
		alive "$1" "$2" && kill -KILL "$1" 2>/dev/null
	done
	procs=()
}
trap 'stop_leftovers; rm -rf "$TMP"' EXIT

worst=0
for rep in $(seq 1 "$reps"); do
	# files of this repetition only: the background job truncates a reused
	# file after the wait below may already have read the last one's lines
	out=$TMP/out.$rep err=$TMP/err.$rep
	OMP_NUM_THREADS=1 "$SLICETRAIN" launch --num-slices 2 --devices-per-slice 2 --threads-per-device 1 -- \
		"$ST_ROOT/configs/base.yml" model_name=llama3-test steps=100000 per_device_batch_size=1 \
		max_target_length=32 ici_fsdp_parallelism=2 dcn_data_parallelism=2 enable_checkpointing=false \
		base_output_directory="$TMP/o" run_name=launch_rank_dies >"$out" 2>"$err" &
	launcher=$!
	procs+=("$launcher $(start_time "$launcher")")
	# wait until training runs (bounded), then a random extra moment
	for _ in $(seq 1 600); do
		grep -q 'completed step' "$out" 2>/dev/null && break
		kill -0 "$launcher" 2>/dev/null || break
		sleep 0.1
	done
	workers=($(pgrep -P "$launcher"))
	for w in "${workers[@]}"; do procs+=("$w $(start_time "$w")"); done
	if ! grep -q 'completed step' "$out" || [ ${#workers[@]} -ne $world ]; then
		fail "rep $rep: no training with $world workers within 60 s (${#workers[@]} workers): $(tail -3 "$err")"
		stop_leftovers
		break
	fi
	sleep "0.$((RANDOM % 10))"
	victim=${workers[$((RANDOM % world))]}
	kill -KILL "$victim"
	t0=$EPOCHREALTIME
	for _ in $(seq 1 200); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.05; done
	dt=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.2f", b-a}')
	if kill -0 "$launcher" 2>/dev/null; then
		fail "rep $rep: the launcher still runs 10 s after worker $victim was killed"
		kill -KILL "$launcher"
	fi
	wait "$launcher"; st=$?
	status_is "rep $rep: the launcher after worker $victim was killed (3: peer failure)" $st 3 "$err"
	left=0
	for p in "${procs[@]}"; do
		set -- $p
		alive "$1" "$2" || continue
		fail "rep $rep: process $1 of the group ($(tr '\0' ' ' <"/proc/$1/cmdline" | cut -c1-60)) still runs after the launcher exited"
		left=$((left + 1))
	done
	stop_leftovers
	worst=$(awk -v a="$worst" -v b="$dt" 'BEGIN{print (b>a)?b:a}')
	echo "rep $rep: killed worker $victim; launcher exited with status $st after ${dt}s; $left process(es) of the group left"
done
echo "worst time from the kill to the launcher's exit: ${worst}s over $reps repetitions"
finish
