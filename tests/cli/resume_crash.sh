# Crash safety: SIGKILL at random moments while checkpoints are being saved
# (every step, async) never leaves a loadable torn checkpoint: every step that
# `ckpt list` calls committed verifies, and the next run resumes from the
# newest committed one. A flipped byte or a truncated shard in the newest
# checkpoint is detected and the run falls back to the one before.
# Repetitions: $CRASH_REPS (default 20). A repetition exercises the crash when
# the files prove it: the run committed a checkpoint of its own, and a later
# step's save had begun (its directory, uncommitted) and not committed when
# the kill landed; at least $CRASH_MIN must (default: half of them, at least
# 1; about 9 in 10 do).
. "$(dirname "$0")/../cli_lib.sh"
reps=${CRASH_REPS:-20}
min=${CRASH_MIN:-$((reps / 2 > 0 ? reps / 2 : 1))}
# about 5 M parameters: a save (weights and two moments) is about 60 MB
model=(model_name=llama3-test override_model_config=true base_emb_dim=256 base_num_decoder_layers=4
	base_mlp_dim=512 vocab_size=4096 base_num_query_heads=4 base_num_kv_heads=2 head_dim=64)
common=("$ST_ROOT/configs/base.yml" "${model[@]}" max_target_length=32 per_device_batch_size=2
	learning_rate=1e-3 learning_rate_schedule_steps=10000 dataset_type=synthetic base_output_directory="$TMP/o"
	run_name=crash checkpoint_period=1 max_num_checkpoints_to_keep=3)
dir="$TMP/o/crash/checkpoints"
# `ckpt list` of the run into file $1
list() { "$SLICETRAIN" ckpt list "$dir" >"$1" 2>/dev/null; }
# the newest committed step in a listing (0: none)
newest_committed() { awk '$2 == "committed" {s = $1} END {print s + 0}' "$1"; }
# the newest step with a manifest (committed), from the files: cheap to poll
newest_manifest() {
	local f n s=0
	for f in "$dir"/*/manifest.json; do
		n=${f%/manifest.json} && n=${n##*/}
		[[ $n =~ ^[0-9]+$ ]] && [ "$n" -gt $s ] && s=$n
	done
	echo $s
}
# whether a step after $1 has a directory and no manifest: a save in flight
save_in_flight() {
	local d n
	for d in "$dir"/*/; do
		n=${d%/} && n=${n##*/}
		[[ $n =~ ^[0-9]+$ ]] && [ "$n" -gt "$1" ] && [ ! -e "$d/manifest.json" ] && return 0
	done
	return 1
}
exercised=0
for rep in $(seq 1 "$reps"); do
	list "$TMP/list0"
	before=$(newest_committed "$TMP/list0")
	OMP_NUM_THREADS=1 "$SLICETRAIN" train "${common[@]}" steps=100000 >"$TMP/run" 2>&1 &
	pid=$!
	# this run commits a checkpoint of its own; a random moment later, once a
	# save is writing its files, and a random 0-9 ms after that, it is killed
	for _ in $(seq 1 2000); do [ "$(newest_manifest)" -gt "$before" ] && break; sleep 0.01; done
	sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
	for _ in $(seq 1 1000); do save_in_flight "$(newest_manifest)" && break; sleep 0.002; done
	sleep "0.00$((RANDOM % 10))"
	kill -KILL $pid; wait $pid 2>/dev/null
	st=$?
	list "$TMP/list1"
	last=$(newest_committed "$TMP/list1")
	# the saves that had begun and not committed when the kill landed: uncommitted
	# steps after the newest committed one, not there before this run
	inflight=$(awk -v last="$last" 'NR == FNR {if ($2 == "uncommitted") old[$1] = 1; next}
		$2 == "uncommitted" && $1 > last && !($1 in old) {print $1}' "$TMP/list0" "$TMP/list1" | paste -sd ' ')
	# every committed checkpoint verifies: a kill never leaves a torn committed one
	[ "$last" -eq 0 ] || "$SLICETRAIN" ckpt verify "$dir" >"$TMP/verify" 2>&1 || fail "rep $rep: a committed checkpoint does not verify: $(tail -2 "$TMP/verify")"
	# the next run resumes from the newest committed step and goes one step further
	"$SLICETRAIN" train "${common[@]}" steps=$((last + 1)) checkpoint_period=100000 save_checkpoint_on_completion=false \
		>"$TMP/resume" 2>&1 || fail "rep $rep: resume failed: $(tail -2 "$TMP/resume")"
	if [ "$last" -gt 0 ]; then
		grep -q "restored step $last " "$TMP/resume" || fail "rep $rep: did not resume from step $last: $(grep -m1 restored "$TMP/resume")"
	fi
	for s in $inflight; do
		grep -q "removing uncommitted checkpoint $dir/$s " "$TMP/resume" || fail "rep $rep: the torn step $s was not removed"
	done
	if [ $st -eq 137 ] && [ "$last" -gt "$before" ] && [ -n "$inflight" ]; then
		exercised=$((exercised + 1))
		echo "rep $rep: killed during the save of step $inflight; committed steps $before -> $last; verified; resumed from $last"
	else
		echo "rep $rep: not exercised (status $st, committed steps $before -> $last, no save in flight); verified; resumed from $last"
	fi
done
echo "$exercised of $reps repetitions killed a save in flight after a commit of their own"
[ $exercised -ge "$min" ] || fail "only $exercised of $reps repetitions exercised a kill during a save (want at least $min)"

# damaged newest checkpoint: fall back to the one before, with a warning
"$SLICETRAIN" train "${common[@]}" run_name=damage steps=4 checkpoint_period=2 >/dev/null 2>&1 || fail "damage: first run failed"
shard="$TMP/o/damage/checkpoints/4/shard-00000-of-00001.safetensors"
size=$(stat -c %s "$shard")
printf '\xff' | dd of="$shard" bs=1 seek=$((size - 1000)) conv=notrunc status=none   # flip bytes in the data
"$SLICETRAIN" train "${common[@]}" run_name=damage steps=5 checkpoint_period=100 save_checkpoint_on_completion=false >"$TMP/fb" 2>&1 \
	|| fail "flipped byte: run failed: $(tail -2 "$TMP/fb")"
grep -q 'restored step 2 ' "$TMP/fb" || fail "flipped byte: did not fall back to step 2"
grep -qi 'warning.*checksum' "$TMP/fb" || fail "flipped byte: no checksum warning: $(grep -i warn "$TMP/fb" | head -2)"
ls -d "$TMP/o/damage/checkpoints/4.unusable-"* >/dev/null 2>&1 || fail "flipped byte: the damaged step was not moved aside"
"$SLICETRAIN" train "${common[@]}" run_name=damage2 steps=4 checkpoint_period=2 >/dev/null 2>&1 || fail "damage2: first run failed"
shard="$TMP/o/damage2/checkpoints/4/shard-00000-of-00001.safetensors"
truncate -s $((size / 2)) "$shard"
"$SLICETRAIN" train "${common[@]}" run_name=damage2 steps=5 checkpoint_period=100 save_checkpoint_on_completion=false >"$TMP/tr" 2>&1 \
	|| fail "truncated shard: run failed: $(tail -2 "$TMP/tr")"
grep -q 'restored step 2 ' "$TMP/tr" || fail "truncated shard: did not fall back to step 2"
echo "flipped byte and truncated shard: fell back to step 2"
finish
