# TensorBoard event files (enable_tensorboard; docs/observability.md), read
# by TensorBoard's own reader and EventAccumulator (.venv-test's tensorboard,
# tests/tensorboard/check_events.py): every scalar equals the metrics file's
# value, names as MaxText's, TFRecord framing and CRC-32C checked, one file
# per writer. A run and its resumed continuation (2 files); an elastic run
# with a preemption and a grow (a file per generation, the controller's
# events as text); enable_tensorboard=false writes nothing; an event
# directory that cannot be created is one error line and exit 1, not a crash.
# timeout: 200
. "$(dirname "$0")/../cli_lib.sh"
py="$ST_ROOT/.venv-test/bin/python"
check="$ST_ROOT/tests/tensorboard/check_events.py"
if ! "$py" -c 'import tensorboard' 2>/dev/null; then
	skip_dep "$py cannot import tensorboard (scripts/install-deps.sh --test installs it)"
fi
base=("$ST_ROOT/configs/base.yml" model_name=llama3-test max_target_length=32 per_device_batch_size=2
	learning_rate=1e-3 base_output_directory="$TMP/o")

# 1. one run with eval, then its resumed continuation: 2 files, steps 0-7
"$SLICETRAIN" train "${base[@]}" run_name=r steps=4 checkpoint_period=2 eval_interval=2 \
	metrics_file="$TMP/r1.jsonl" >"$TMP/r1.out" 2>&1 || fail "run: exit $?: $(tail -2 "$TMP/r1.out")"
"$py" "$check" "$TMP/o/r/tensorboard" 1 "$TMP/r1.jsonl" || fail "run: event file"
sleep 1 # a later second: the next file sorts after this one by time, not only by the bump
"$SLICETRAIN" train "${base[@]}" run_name=r steps=8 checkpoint_period=2 eval_interval=2 \
	metrics_file="$TMP/r2.jsonl" >"$TMP/r2.out" 2>&1 || fail "resumed run: exit $?: $(tail -2 "$TMP/r2.out")"
grep -q 'restored step 4' "$TMP/r2.out" || fail "the second run did not resume"
"$py" "$check" "$TMP/o/r/tensorboard" 2 "$TMP/r1.jsonl" "$TMP/r2.jsonl" || fail "resumed run: event files"

# 2. off: no directory
"$SLICETRAIN" train "${base[@]}" run_name=off steps=2 enable_tensorboard=false >"$TMP/off.out" 2>&1 \
	|| fail "enable_tensorboard=false: exit $?"
[ -e "$TMP/o/off/tensorboard" ] && fail "enable_tensorboard=false wrote $TMP/o/off/tensorboard"

# 3. a directory that cannot be made: exit 1, one error line naming it
: >"$TMP/afile"
mkdir -p "$TMP/o/tbfile" && : >"$TMP/o/tbfile/tensorboard"
bad_dir() { # NAME PATTERN KEYS...: exit 1 and the error; the same run trains with enable_tensorboard=false
	local name=$1 pattern=$2; shift 2
	"$SLICETRAIN" train "${base[@]}" steps=2 enable_checkpointing=false "$@" >"$TMP/bad.out" 2>"$TMP/bad.err"
	local rc=$?
	if status_is "$name" $rc 1 "$TMP/bad.err"; then
		if [ "$(grep -c '^slicetrain: error:' "$TMP/bad.err")" -ne 1 ] ||
			! grep '^slicetrain: error:' "$TMP/bad.err" | grep -qE -- "$pattern"; then
			fail "$name: want one error line matching /$pattern/: $(cat "$TMP/bad.err")"
		else
			echo "ok   $name: $(grep '^slicetrain: error:' "$TMP/bad.err")"
		fi
	fi
	grep -q 'completed step' "$TMP/bad.out" && fail "$name: trained despite the error"
	"$SLICETRAIN" train "${base[@]}" steps=2 enable_checkpointing=false "$@" enable_tensorboard=false \
		>"$TMP/bad.out" 2>&1 || fail "$name: enable_tensorboard=false should train: $(tail -1 "$TMP/bad.out")"
}
bad_dir "a file as base_output_directory" "cannot create the TensorBoard directory: .*afile: exists and is not a directory" \
	base_output_directory="$TMP/afile" run_name=x
bad_dir "a file named tensorboard" "cannot create the TensorBoard directory: .*tbfile/tensorboard: exists and is not a directory" \
	run_name=tbfile
bad_dir "under /proc" "cannot create the TensorBoard directory: /proc/self/x" base_output_directory=/proc/self/x run_name=y

# 4. elastic: slice 1 preempted after step 2 and back 1 s later; a file per
# generation. Steps paced to 0.05 s (SLICETRAIN_MIN_STEP_SECONDS; about 0.015
# s each unpaced here), so that the group grows back near step 30 of 60 on any
# CPU and the controller's last event ("reform") is in the metrics file
# before the last step reads it: unpaced on a fast CPU the slice came back
# at step 58 and the run ended before its "reform" line was written.
OMP_NUM_THREADS=1 SLICETRAIN_MIN_STEP_SECONDS=0.05 "$SLICETRAIN" launch --threads-per-device 1 --num-slices 2 --min-slices 1 --devices-per-slice 1 \
	--preempt 1@2:1 -- "$ST_ROOT/configs/base.yml" model_name=llama3-test per_device_batch_size=8 max_target_length=128 \
	checkpoint_period=5 dcn_data_parallelism=-1 learning_rate=1e-3 base_output_directory="$TMP/o" run_name=el steps=60 \
	eval_interval=10 metrics_file="$TMP/el.jsonl" >"$TMP/el.out" 2>"$TMP/el.err"
status_is "elastic run" $? 0 "$TMP/el.err"
grep '"event"' "$TMP/el.jsonl" | sed 's/^/    /'
"$py" "$check" "$TMP/o/el/tensorboard" +2 "$TMP/el.jsonl" || fail "elastic run: event files"
finish
