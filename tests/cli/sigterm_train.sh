# SIGTERM to a single `slicetrain train` while it trains (after its Kth
# "completed step" line, K random, checkpoints saved asynchronously every
# step so that the signal often lands during a background save): the process
# ends within 10 s with exit status 143 after finishing its step, saying
# after which step; it leaves no *.tmp.* file, no uncommitted checkpoint
# directory (a clean stop lets the save in flight commit), every checkpoint
# verifies (`slicetrain ckpt verify`), the metrics file holds one complete
# JSON line per completed step (steps 0..S in order, S the step named in the
# stop message), and a restart with the same run_name resumes from the
# newest checkpoint. Repeated SIGTERM_REPS times (default 8; 2 on the
# sanitized build), each at another moment. (Before the handler had a stack
# of its own, 1 SIGTERM in 5 during a step corrupted the heap in oneDNN's gemm:
# exit 134; 8 repetitions see that 3 times in 4.)
. "$(dirname "$0")/../cli_lib.sh"
reps=${SIGTERM_REPS:-8}
grep -qa __asan_init "$SLICETRAIN" && reps=${SIGTERM_REPS:-2}
common=("$ST_ROOT/configs/base.yml" model_name=llama3-test per_device_batch_size=4 max_target_length=64
	dataset_type=synthetic base_output_directory="$TMP/o" checkpoint_period=1 async_checkpointing=true log_period=1)

# wait_for SECONDS CONDITION...: poll every 50 ms until CONDITION holds; 1 on timeout
wait_for() {
	local end=$((SECONDS + $1)); shift
	until "$@"; do [ $SECONDS -ge $end ] && return 1; sleep 0.05; done
}
completed() { local n; n=$(grep -sc '^completed step' "$1"); [ "${n:-0}" -ge "$2" ]; }
gone() { ! kill -0 "$1" 2>/dev/null; }

for rep in $(seq 1 "$reps"); do
	name=r$rep k=$((1 + RANDOM % 8))
	"$SLICETRAIN" train "${common[@]}" steps=100000 run_name=$name metrics_file="$TMP/$name.jsonl" \
		>"$TMP/$name.out" 2>"$TMP/$name.err" &
	pid=$!
	if ! wait_for 60 completed "$TMP/$name.out" $k; then
		fail "$name: no $k completed steps within 60 s: $(tail -2 "$TMP/$name.err")"; kill -KILL $pid; wait $pid; continue
	fi
	kill -TERM $pid
	if ! wait_for 10 gone $pid; then
		fail "$name: still running 10 s after SIGTERM"; kill -KILL $pid; wait $pid; continue
	fi
	wait $pid; rc=$?
	status_is "$name (SIGTERM)" $rc 143 "$TMP/$name.err"
	last=$(sed -n 's/.*stopped by signal 15 after step \([0-9]*\).*/\1/p' "$TMP/$name.err")
	[ -n "$last" ] || { fail "$name: no 'stopped by signal 15 after step N' line: $(tail -2 "$TMP/$name.err")"; continue; }
	ck="$TMP/o/$name/checkpoints"
	tmps=$(find "$TMP/o/$name" -name '*.tmp.*' | head -3)
	[ -z "$tmps" ] || fail "$name: temporary files left: $tmps"
	n=0
	for d in "$ck"/*/; do
		d=${d%/}; [ -d "$d" ] || continue; n=$((n + 1))
		[ -f "$d/manifest.json" ] || fail "$name: uncommitted checkpoint $(basename "$d") left ($(ls "$d" | tr '\n' ' '))"
	done
	"$SLICETRAIN" ckpt verify "$ck" >"$TMP/$name.verify" 2>&1 || fail "$name: ckpt verify: $(tail -2 "$TMP/$name.verify")"
	newest=$(ls "$ck" | grep -E '^[0-9]+$' | sort -n | tail -1)
	/usr/bin/python3 - "$TMP/$name.jsonl" "$last" "$(grep -c '^completed step' "$TMP/$name.out")" "${newest:-0}" <<'PY' \
		|| fail "$name: metrics file, log and checkpoints disagree"
import json, sys
lines = open(sys.argv[1]).read().split("\n")
last, printed, newest = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
assert lines[-1] == "", "the metrics file does not end with a newline"
steps = [json.loads(l)["step"] for l in lines[:-1]]  # every line complete JSON
assert steps == list(range(last + 1)), f"metrics steps {steps[:3]}...{steps[-3:]}, want 0..{last}"
assert printed == last + 1, f"{printed} completed-step lines, want {last + 1}"
# the step after which it stopped was saved (checkpoint_period 1): nothing lost
assert newest == last + 1, f"newest checkpoint {newest}, want {last + 1}"
print(f"stopped after step {last}: {printed} steps logged, newest checkpoint {newest}")
PY
	echo "ok   $name: SIGTERM after completed step $((k - 1)): exit $rc, stopped after step $last, $n checkpoints, verify ok"
done

# a restart of the last run resumes from its newest checkpoint and finishes
if [ -n "${newest:-}" ]; then
	"$SLICETRAIN" train "${common[@]}" steps=$((newest + 2)) run_name=$name >"$TMP/resume.out" 2>"$TMP/resume.err" \
		|| fail "resume after SIGTERM failed: $(tail -2 "$TMP/resume.err")"
	grep -q "restored step $newest " "$TMP/resume.err" || fail "the restart did not restore step $newest: $(grep -m1 restored "$TMP/resume.err")"
	[ "$(grep -c '^completed step' "$TMP/resume.out")" -eq 2 ] || fail "the restart did not train exactly the 2 remaining steps"
fi
finish
