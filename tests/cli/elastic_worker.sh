# The worker side of elastic training (src/elastic/proto.h, "The worker
# contract"), driven by hand with the plain launcher and `slicetrain train`:
#  a. SIGUSR1 (a resize request) to one worker of a 2-device group: every
#     worker stops after the same step S and exits 138 (the launcher too:
#     its first reaped worker's status), having committed checkpoint S+1
#     (period far away); the run resumes on ONE device
#     (SLICETRAIN_ELASTIC_MAX_DEVICES=2: twice the gradient accumulation,
#     the same global batch), then grows back to 2 devices and finishes. Its
#     final weights are within 1e-4 (relative, by norm, per tensor) of an
#     uninterrupted 2-device run of the same steps, its losses within 1e-5,
#     and the SLICETRAIN_SAMPLE_LOG records of the whole history are the
#     global samples 0..N-1, each once, in order of steps.
#  b. SIGTERM (a preemption notice) to a single process: 143, checkpoint
#     S+1 committed, async and sync saves, a second signal during the stop
#     changes nothing.
#  c. Bad SLICETRAIN_ELASTIC_MAX_DEVICES and SLICETRAIN_MIN_STEP_SECONDS
#     values and a bad elastic_batch: exit 2, one `slicetrain: error:` line.
#     SLICETRAIN_MIN_STEP_SECONDS=0.25: each step lasts at least 0.25 s.
#  d. elastic_batch=scale: the global batch (total_weights) follows the
#     devices; constant keeps W_max's. SLICETRAIN_GENERATION: metrics_file
#     is appended to, else truncated.
# timeout: 120
. "$(dirname "$0")/../cli_lib.sh"
need_python numpy
export OMP_NUM_THREADS=1
N=200 # steps of the elastic history and of the reference (its schedule's steps)
common=("$ST_ROOT/configs/base.yml" model_name=llama3-test per_device_batch_size=1 max_target_length=64
	learning_rate=1e-3 learning_rate_schedule_steps=$N base_output_directory="$TMP/o" log_period=1
	dataset_type=tokens dataset_path="$TMP/rows.npy" checkpoint_period=100000 async_checkpointing=true)

# token rows (97 of them: samples past an epoch come from a new permutation)
/usr/bin/python3 - "$TMP" <<'PY'
import struct, sys
T1, rows = 65, 97
toks = [(r * 7 + t * 13 + (r * t) % 5) % 256 for r in range(rows) for t in range(T1)]
h = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d, %d), }" % (rows, T1)
h += " " * (63 - (10 + len(h)) % 64) + "\n"
with open(sys.argv[1] + "/rows.npy", "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode())
    f.write(struct.pack("<%di" % len(toks), *toks))
PY

# wait_for SECONDS CONDITION...: poll every 20 ms until CONDITION holds; 1 on timeout
wait_for() {
	local end=$((SECONDS + $1)); shift
	until "$@"; do [ $SECONDS -ge $end ] && return 1; sleep 0.02; done
}
completed() { local n; n=$(grep -sc '^completed step' "$1"); [ "${n:-0}" -ge "$2" ]; }
gone() { ! kill -0 "$1" 2>/dev/null; }
# stop_pid PID: SIGKILL and reap a process of ours that overstayed
stop_pid() { kill -KILL "$1" 2>/dev/null; wait "$1" 2>/dev/null; }
newest_ckpt() { ls "$1" 2>/dev/null | grep -E '^[0-9]+$' | sort -n | tail -1; }
total_weights() { sed -n 's/.*total_weights: \([0-9]*\),.*/\1/p' "$1" | sort -u | tr '\n' ' ' | sed 's/ $//'; }
export_weights() { # run step
	"$SLICETRAIN" export "$TMP/o/$1/checkpoints/$2" "$TMP/hf-$1" >/dev/null 2>"$TMP/$1.export.err" ||
		fail "$1: export of step $2 failed: $(tail -1 "$TMP/$1.export.err")"
}
. "$ST_ROOT/tests/mesh_lib.sh" # mesh_compare_weights

# --- a. resize: 2 devices -> SIGUSR1 -> 1 device -> 2 devices, against 2 devices throughout
export SLICETRAIN_ELASTIC_MAX_DEVICES=2
"$SLICETRAIN" launch --num-slices 2 --devices-per-slice 1 -- "${common[@]}" steps=$N run_name=ref \
	metrics_file="$TMP/ref.jsonl" >"$TMP/ref.out" 2>"$TMP/ref.err" || fail "reference run failed: $(tail -3 "$TMP/ref.err")"
SLICETRAIN_SAMPLE_LOG="$TMP/samples" "$SLICETRAIN" launch --num-slices 2 --devices-per-slice 1 -- "${common[@]}" \
	steps=100000 run_name=el metrics_file="$TMP/el1.jsonl" >"$TMP/el1.out" 2>"$TMP/el1.err" & # it cannot end first
lpid=$!
stopped=
if ! wait_for 30 completed "$TMP/el1.out" 5; then
	fail "2-device run: no 5 completed steps within 30 s: $(tail -2 "$TMP/el1.err")"; stop_pid $lpid
else
	wpid=$(ps -o pid= --ppid $lpid | sort -n | sed -n 2p | tr -d ' ') # rank 1
	[ -n "$wpid" ] && kill -USR1 "$wpid"
	if ! wait_for 20 gone $lpid; then
		fail "2-device run: still running 20 s after SIGUSR1 to rank 1 (pid ${wpid:-none})"; stop_pid $lpid
	else
		wait $lpid; rc=$?
		status_is "2 devices, SIGUSR1 to rank 1: launcher" $rc 138 "$TMP/el1.err" && stopped=1
	fi
fi
if [ -n "$stopped" ]; then
	s0=$(sed -n 's/^slicetrain: stopped by signal 10 after step \([0-9]*\)$/\1/p' "$TMP/el1.err")
	s1=$(sed -n 's/^\[rank 1\] slicetrain: stopped by signal 10 after step \([0-9]*\)$/\1/p' "$TMP/el1.err")
	grep -q 'killed by signal' "$TMP/el1.err" && fail "a worker was killed: $(grep -m1 'killed by signal' "$TMP/el1.err")"
	grep -qE 'rank [01] exited with status 138;' "$TMP/el1.err" || fail "the launcher saw no worker exit 138"
	if [ -z "$s0" ] || [ "$s0" != "$s1" ]; then
		fail "the workers did not both stop by signal 10 after the same step (rank 0 '${s0}', rank 1 '${s1}')"
		stopped=
	elif [ "$s0" -ge $((N - 21)) ]; then
		fail "the stop came too late (after step $s0 of $N) to leave room for the rest (loaded machine?)"
		stopped=
	fi
fi
if [ -n "$stopped" ]; then
	S=$((s0 + 1)) # checkpoint of the stop
	grep -q "^slicetrain: stopping after step $s0 (signal 10): checkpoint $S saved$" "$TMP/el1.err" ||
		fail "no 'checkpoint $S saved' line on rank 0"
	"$SLICETRAIN" ckpt list "$TMP/o/el/checkpoints" >"$TMP/list" 2>&1 || fail "ckpt list: $(tail -1 "$TMP/list")"
	got=$(awk '$2 == "committed" {print $1}' "$TMP/list" | sort -n | tail -1)
	[ "$got" = "$S" ] || fail "newest committed checkpoint '${got}', want $S (the step the workers stopped after, +1)"
	echo "ok   2 devices: SIGUSR1 to rank 1 after 5 completed steps: both ranks exit 138 after step $s0, checkpoint $S committed"

	# the 1-device part: accumulation 2, global batch of 2 devices
	M=$((S + 10))
	SLICETRAIN_SAMPLE_LOG="$TMP/samples" "$SLICETRAIN" train "${common[@]}" steps=$M run_name=el \
		metrics_file="$TMP/el2.jsonl" >"$TMP/el2.out" 2>"$TMP/el2.err"
	status_is "1 device, steps $S..$((M - 1))" $? 0 "$TMP/el2.err"
	grep -q "restored step $S " "$TMP/el2.err" || fail "1 device: did not restore step $S: $(grep -m1 restored "$TMP/el2.err")"
	grep -q 'gradient accumulation 2,' "$TMP/el2.err" || fail "1 device: accumulation is not 2: $(grep -m1 'gradient accumulation' "$TMP/el2.err")"
	[ "$(total_weights "$TMP/el2.out")" = 128 ] || fail "1 device: total_weights $(total_weights "$TMP/el2.out"), want 128 (2 rows x 64)"
	# grow back: 2 devices to the end
	SLICETRAIN_SAMPLE_LOG="$TMP/samples" "$SLICETRAIN" launch --num-slices 2 --devices-per-slice 1 -- "${common[@]}" \
		steps=$N run_name=el metrics_file="$TMP/el3.jsonl" >"$TMP/el3.out" 2>"$TMP/el3.err"
	status_is "2 devices again, steps $M..$((N - 1))" $? 0 "$TMP/el3.err"
	grep -q "restored step $M " "$TMP/el3.err" || fail "2 devices again: did not restore step $M"
	[ "$(total_weights "$TMP/ref.out")" = 128 ] || fail "reference: total_weights $(total_weights "$TMP/ref.out"), want 128"

	cat "$TMP/el1.jsonl" "$TMP/el2.jsonl" "$TMP/el3.jsonl" >"$TMP/el.jsonl"
	same_losses "losses of 2 -> 1 -> 2 devices vs 2 throughout" "$TMP/ref.jsonl" "$TMP/el.jsonl" $N 1e-5
	export_weights ref $N
	export_weights el $N
	mesh_compare_weights "$TMP/hf-ref/model.safetensors" "$TMP/hf-el/model.safetensors" "weights 2 -> 1 -> 2 devices" 1e-4
	cat "$TMP"/samples.* | /usr/bin/python3 -c '
import sys
n, g = int(sys.argv[1]), 2
rec = [tuple(map(int, l.split())) for l in sys.stdin]
idx = sorted(s for _, s in rec)
print(f"samples trained: {len(idx)} over {n} steps of {g}; in the right steps: {all(s // g == st for st, s in rec)}")
sys.exit(0 if idx == list(range(n * g)) and all(s // g == st for st, s in rec) else 1)' $N ||
		fail "samples skipped, repeated or in the wrong step across 2 -> 1 -> 2 devices"
fi

# --- b. SIGTERM (a preemption notice) to one process, async and sync saves; a second signal during the stop
for mode in true false; do
	name=term-$mode
	"$SLICETRAIN" train "${common[@]}" steps=100000 async_checkpointing=$mode run_name=$name \
		>"$TMP/$name.out" 2>"$TMP/$name.err" &
	pid=$!
	if ! wait_for 30 completed "$TMP/$name.out" 3; then
		fail "$name: no 3 completed steps within 30 s"; stop_pid $pid; continue
	fi
	kill -TERM $pid; kill -TERM $pid 2>/dev/null
	if ! wait_for 10 gone $pid; then fail "$name: still running 10 s after SIGTERM"; stop_pid $pid; continue; fi
	wait $pid; rc=$?
	status_is "$name (SIGTERM twice)" $rc 143 "$TMP/$name.err" || continue
	s=$(sed -n 's/^slicetrain: stopped by signal 15 after step \([0-9]*\)$/\1/p' "$TMP/$name.err")
	[ -n "$s" ] || { fail "$name: no 'stopped by signal 15 after step N' line"; continue; }
	newest=$(newest_ckpt "$TMP/o/$name/checkpoints")
	[ "$newest" = $((s + 1)) ] || fail "$name: newest checkpoint '$newest', want $((s + 1))"
	grep -q "stopping after step $s (signal 15): checkpoint $((s + 1)) saved" "$TMP/$name.err" || fail "$name: no save-at-stop line"
	"$SLICETRAIN" ckpt verify "$TMP/o/$name/checkpoints" >"$TMP/$name.verify" 2>&1 || fail "$name: ckpt verify: $(tail -1 "$TMP/$name.verify")"
	echo "ok   $name: SIGTERM twice: exit 143 after step $s, checkpoint $newest committed and verified"
done
# a stop right after a periodic save (period 1) does not save the step twice
"$SLICETRAIN" train "${common[@]}" steps=100000 checkpoint_period=1 run_name=period >"$TMP/period.out" 2>"$TMP/period.err" &
pid=$!
if wait_for 30 completed "$TMP/period.out" 3; then
	kill -USR1 $pid
	wait_for 10 gone $pid || { fail "period: still running 10 s after SIGUSR1"; stop_pid $pid; }
	wait $pid; rc=$?
	status_is "period 1, SIGUSR1" $rc 138 "$TMP/period.err"
	grep -q 'already exists' "$TMP/period.err" && fail "period 1: the stop saved a step twice"
	s=$(sed -n 's/^slicetrain: stopped by signal 10 after step \([0-9]*\)$/\1/p' "$TMP/period.err")
	[ -n "$s" ] && [ "$(newest_ckpt "$TMP/o/period/checkpoints")" = $((s + 1)) ] || fail "period 1: newest checkpoint is not the stop's"
else
	fail "period: no 3 completed steps within 30 s"; stop_pid $pid
fi

# --- c. bad values: exit 2 with one clear error line
one=("$ST_ROOT/configs/base.yml" model_name=llama3-test per_device_batch_size=1 max_target_length=32 steps=2
	base_output_directory="$TMP/o" run_name=bad)
for v in 0 x -1 2x 99999999999; do
	SLICETRAIN_ELASTIC_MAX_DEVICES=$v expect_error "SLICETRAIN_ELASTIC_MAX_DEVICES=$v" \
		"SLICETRAIN_ELASTIC_MAX_DEVICES='$v' is not a device count" -- train "${one[@]}"
done
for v in x -1 nan 1e9 0.1s; do
	SLICETRAIN_MIN_STEP_SECONDS=$v expect_error "SLICETRAIN_MIN_STEP_SECONDS=$v" \
		"SLICETRAIN_MIN_STEP_SECONDS='$v' is not a number of seconds from 0 to 3600" -- train "${one[@]}"
	SLICETRAIN_TEST_SAVE_SECONDS=$v expect_error "SLICETRAIN_TEST_SAVE_SECONDS=$v" \
		"SLICETRAIN_TEST_SAVE_SECONDS='$v' is not a number of seconds from 0 to 3600" -- train "${one[@]}"
done
SLICETRAIN_TEST_HANG_FILE=$(printf '/x%.0s' $(seq 3000)) expect_error "SLICETRAIN_TEST_HANG_FILE too long" \
	"SLICETRAIN_TEST_HANG_FILE is longer than" -- train "${one[@]}"
# the pacing the elastic tests use: every step lasts at least that long
SLICETRAIN_MIN_STEP_SECONDS=0.25 "$SLICETRAIN" train "${one[@]}" steps=3 enable_checkpointing=false \
	>"$TMP/paced.out" 2>"$TMP/paced.err"
status_is "SLICETRAIN_MIN_STEP_SECONDS=0.25" $? 0 "$TMP/paced.err" &&
	{ secs=$(sed -n 's/^completed step: [0-9]*, seconds: \([0-9.]*\),.*/\1/p' "$TMP/paced.out" | tr '\n' ' ')
	  if /usr/bin/python3 -c 'import sys; v = [float(x) for x in sys.argv[1:]]; sys.exit(len(v) != 3 or min(v) < 0.25)' $secs; then
		echo "ok   SLICETRAIN_MIN_STEP_SECONDS=0.25: step seconds $secs"
	  else
		fail "SLICETRAIN_MIN_STEP_SECONDS=0.25: step seconds '$secs', want 3 of at least 0.25"
	  fi; }
expect_error "elastic_batch=maybe" "elastic_batch 'maybe' is not supported.*constant, scale" -- train "${one[@]}" elastic_batch=maybe
# a group: smaller than the group, and a size whose accumulation is not whole
launch_error() { # name pattern max_devices keys...
	local name=$1 pat=$2
	SLICETRAIN_ELASTIC_MAX_DEVICES=$3 "$SLICETRAIN" launch --num-slices 1 --devices-per-slice 2 -- "${one[@]}" "${@:4}" \
		>"$TMP/$name.out" 2>"$TMP/$name.err"
	local rc=$?
	status_is "$name" $rc 2 "$TMP/$name.err" || return
	local n
	n=$(grep -cE "^(\[rank 1\] )?slicetrain: error: $pat" "$TMP/$name.err")
	[ "$n" -ge 1 ] || { fail "$name: no error matching /$pat/: $(grep -m1 'error' "$TMP/$name.err")"; return; }
	[ "$(grep -c 'slicetrain: error:' "$TMP/$name.err")" -eq "$n" ] || fail "$name: other error lines: $(grep 'error:' "$TMP/$name.err")"
	grep -q 'completed step' "$TMP/$name.out" && fail "$name: trained despite the error"
	echo "ok   $name: exit 2: $(grep -m1 'slicetrain: error:' "$TMP/$name.err")"
}
launch_error "W_max 1 on 2 devices" "SLICETRAIN_ELASTIC_MAX_DEVICES=1 is smaller than this group's 2 devices" 1
launch_error "W_max 3 on 2 devices" "elastic_batch constant: the global batch of 3 devices .* cannot be kept on 2 devices \(2 does not divide 3" 3
# ... which gradient_accumulation_steps 2 makes whole (3 micro-batches each), and scale needs no division
SLICETRAIN_ELASTIC_MAX_DEVICES=3 "$SLICETRAIN" launch --num-slices 1 --devices-per-slice 2 -- "${one[@]}" \
	gradient_accumulation_steps=2 enable_checkpointing=false >"$TMP/w3.out" 2>"$TMP/w3.err"
status_is "W_max 3, accumulation 2, on 2 devices" $? 0 "$TMP/w3.err" &&
	{ [ "$(total_weights "$TMP/w3.out")" = 192 ] || fail "W_max 3 on 2 devices: total_weights $(total_weights "$TMP/w3.out"), want 192 (6 x 32)"; }
grep -q 'gradient accumulation 3,' "$TMP/w3.err" || fail "W_max 3 on 2 devices with accumulation 2: not 3 micro-batches"

# --- d. elastic_batch: scale follows the devices, constant keeps W_max's; SLICETRAIN_GENERATION appends
for b in scale constant; do
	SLICETRAIN_ELASTIC_MAX_DEVICES=4 "$SLICETRAIN" train "${one[@]}" elastic_batch=$b enable_checkpointing=false \
		>"$TMP/$b.out" 2>"$TMP/$b.err"
	status_is "elastic_batch=$b on 1 of 4 devices" $? 0 "$TMP/$b.err"
done
[ "$(total_weights "$TMP/scale.out")" = 32 ] || fail "elastic_batch=scale: total_weights $(total_weights "$TMP/scale.out"), want 32 (1 device x 1 row x 32)"
[ "$(total_weights "$TMP/constant.out")" = 128 ] || fail "elastic_batch=constant: total_weights $(total_weights "$TMP/constant.out"), want 128 (4 devices' rows x 32)"
SLICETRAIN_ELASTIC_MAX_DEVICES=4 "$SLICETRAIN" launch --num-slices 2 --devices-per-slice 1 -- "${one[@]}" \
	elastic_batch=scale enable_checkpointing=false >"$TMP/scale2.out" 2>"$TMP/scale2.err"
status_is "elastic_batch=scale on 2 of 4 devices" $? 0 "$TMP/scale2.err"
[ "$(total_weights "$TMP/scale2.out")" = 64 ] || fail "elastic_batch=scale on 2 devices: total_weights $(total_weights "$TMP/scale2.out"), want 64"
echo "ok   total_weights on 1 of 4 devices: scale $(total_weights "$TMP/scale.out"), constant $(total_weights "$TMP/constant.out"); scale on 2: $(total_weights "$TMP/scale2.out")"
unset SLICETRAIN_ELASTIC_MAX_DEVICES
for g in 1 2; do
	SLICETRAIN_GENERATION=$g "$SLICETRAIN" train "${one[@]}" enable_checkpointing=false metrics_file="$TMP/gen.jsonl" \
		>/dev/null 2>"$TMP/gen$g.err" || fail "generation $g failed: $(tail -1 "$TMP/gen$g.err")"
done
[ "$(grep -c '"step"' "$TMP/gen.jsonl")" -eq 4 ] || fail "SLICETRAIN_GENERATION: $(grep -c '"step"' "$TMP/gen.jsonl") records after 2 generations of 2 steps, want 4 (appended)"
"$SLICETRAIN" train "${one[@]}" enable_checkpointing=false metrics_file="$TMP/gen.jsonl" >/dev/null 2>&1
[ "$(grep -c '"step"' "$TMP/gen.jsonl")" -eq 2 ] || fail "without SLICETRAIN_GENERATION the metrics file is not truncated"
finish
