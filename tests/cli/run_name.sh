# A derived run name (run_name empty) is always a new run's: runs started
# in the same minute, even the same second, stay apart. Two trainings and a
# static and an elastic launch started together with another sequence
# length and batch each get a name of their own, none resumes another's
# checkpoint, and each run's checkpoint holds its own config; the workers of
# a launch all use the launcher's one name (one checkpoint directory
# written by both processes). A name whose directory exists (made by a run
# in the same second) gets _2. A hand-started group without run_name is
# refused (its processes would each derive a name of their own).
# timeout: 120
. "$(dirname "$0")/../cli_lib.sh"
out=$TMP/o
common=("$ST_ROOT/configs/base.yml" model_name=llama3-test steps=4 checkpoint_period=2 base_output_directory="$out"
	enable_tensorboard=false)
export OMP_NUM_THREADS=1

# the names the runs print ("slicetrain: run NAME: ...")
name_of() { sed -n 's/^slicetrain: run \([^:]*\): .*/\1/p' "$1" | head -1; }

# four runs started together, each with its own batch and sequence length
"$SLICETRAIN" train "${common[@]}" per_device_batch_size=2 max_target_length=16 >"$TMP/a.out" 2>&1 &
pa=$!
"$SLICETRAIN" train "${common[@]}" per_device_batch_size=4 max_target_length=32 >"$TMP/b.out" 2>&1 &
pb=$!
"$SLICETRAIN" launch --num-slices 1 --devices-per-slice 2 -- "${common[@]}" per_device_batch_size=1 \
	max_target_length=24 >"$TMP/c.out" 2>&1 &
pc=$!
"$SLICETRAIN" launch --num-slices 1 --min-slices 1 --devices-per-slice 1 -- "${common[@]}" per_device_batch_size=3 \
	max_target_length=8 >"$TMP/d.out" 2>&1 &
pd=$!
for r in a:$pa b:$pb c:$pc d:$pd; do
	wait "${r#*:}"
	status_is "run ${r%%:*}" $? 0 "$TMP/${r%%:*}.out"
done
declare -A seq=([a]=16 [b]=32 [c]=24 [d]=8) rows=([a]=2 [b]=4 [c]=2 [d]=3) procs=([a]=1 [b]=1 [c]=2 [d]=1)
names=()
for r in a b c d; do
	n=$(name_of "$TMP/$r.out")
	echo "run $r: $n (max_target_length ${seq[$r]})"
	[[ "$n" =~ ^llama3-test_[0-9]{4}(-[0-9]{2}){5}(_[0-9]+)?$ ]] || fail "run $r: derived name '$n' is not <model>_<date to the second>[_k]"
	grep -q 'restored step' "$TMP/$r.out" && fail "run $r resumed a checkpoint: $(grep 'restored step' "$TMP/$r.out")"
	m=$out/$n/checkpoints/4/manifest.json
	/usr/bin/python3 - "$m" "${seq[$r]}" "${rows[$r]}" "${procs[$r]}" <<'PY' || fail "run $r: its checkpoint is not its own ($m)"
import json, sys
m = json.load(open(sys.argv[1]))
c = json.loads(m["config"]) if isinstance(m["config"], str) else m["config"]
seq, rows, procs = map(int, sys.argv[2:])
assert c["max_target_length"] == seq and m["global_batch"] == rows and m["process_count"] == procs, (c["max_target_length"], m["global_batch"], m["process_count"])
PY
	names+=("$n")
done
[ "$(printf '%s\n' "${names[@]}" | sort -u | wc -l)" -eq 4 ] || fail "the 4 runs do not have 4 names: ${names[*]}"
[ "$(ls "$out" | wc -l)" -eq 4 ] || fail "not 4 run directories: $(ls "$out")"
# (the static launch's 2 workers wrote one checkpoint together: process_count 2 above)

# a name whose directory exists gets _2: directories for the next seconds, made first
mkdir -p "$TMP/o2"
for s in 0 1 2 3 4 5 6 7 8 9; do
	d=$TMP/o2/llama3-test_$(date -d "+$s seconds" +%Y-%m-%d-%H-%M-%S)
	mkdir -p "$d" && touch "$d/someone-elses"
done
"$SLICETRAIN" train "${common[@]}" base_output_directory="$TMP/o2" steps=1 per_device_batch_size=1 \
	max_target_length=8 >"$TMP/e.out" 2>&1
status_is "run into existing directories" $? 0 "$TMP/e.out"
n=$(name_of "$TMP/e.out")
echo "run e: $n (its second's directory existed)"
[[ "$n" == *_2 ]] || fail "run e: '$n' does not end in _2"
[ -d "$TMP/o2/$n/checkpoints/1" ] || fail "run e: no checkpoint in its own directory $n"
for d in "$TMP"/o2/*; do
	[[ "$d" == *_2 ]] && continue
	[ "$(ls -A "$d")" = someone-elses ] || fail "run e wrote into $d"
done

# a hand-started group of 2 without run_name: refused before it starts
SLICETRAIN_RANK=1 SLICETRAIN_WORLD_SIZE=2 SLICETRAIN_COORDINATOR=127.0.0.1:1 \
	expect_error "group without run_name" "run_name is empty.*2 processes.*set run_name" -- train "${common[@]}"
finish
