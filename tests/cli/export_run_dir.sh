# slicetrain export takes the paths generate and ckpt list take: a step
# directory, a run's checkpoints directory, or the run directory itself
# (its newest committed step); the three exports of the newest step are the
# same files. A directory with no committed checkpoint is refused (exit 2)
# naming what it is not.
# timeout: 60
. "$(dirname "$0")/../cli_lib.sh"
run=$TMP/o/r
OMP_NUM_THREADS=1 "$SLICETRAIN" train "$ST_ROOT/configs/base.yml" model_name=llama3-test steps=4 checkpoint_period=2 \
	per_device_batch_size=2 max_target_length=16 base_output_directory="$TMP/o" run_name=r >"$TMP/train.out" 2>&1
status_is "training" $? 0 "$TMP/train.out"

for what in "$run/checkpoints/4" "$run/checkpoints" "$run"; do
	d=$TMP/hf.$(echo "$what" | md5sum | cut -c1-8)
	"$SLICETRAIN" export "$what" "$d" >"$TMP/export.out" 2>&1
	status_is "export $what" $? 0 "$TMP/export.out" || continue
	[ -f "$d/model.safetensors" ] && [ -f "$d/config.json" ] || fail "export $what: no model files in $d"
	echo "ok   export ${what#"$TMP"/}: $(sha256sum "$d/model.safetensors" | cut -c1-16)"
done
[ "$(sha256sum "$TMP"/hf.*/model.safetensors | cut -d' ' -f1 | sort -u | wc -l)" -eq 1 ] ||
	fail "the exports of the step, checkpoints and run directories differ"
[ "$(sha256sum "$TMP"/hf.*/config.json | cut -d' ' -f1 | sort -u | wc -l)" -eq 1 ] || fail "the exports' config.json differ"
"$SLICETRAIN" export "$run/checkpoints/2" "$TMP/step2" >/dev/null 2>&1 &&
	cmp -s "$TMP/step2/model.safetensors" "$(ls "$TMP"/hf.*/model.safetensors | head -1)" &&
	fail "step 2's export equals the newest step's: the run directory did not mean its newest step"
# what generate and ckpt list take, the same path
"$SLICETRAIN" ckpt list "$run" >"$TMP/list.out" 2>&1 && grep -q '^4 ' "$TMP/list.out" || fail "ckpt list $run: $(cat "$TMP/list.out")"
"$SLICETRAIN" generate "$run" --prompt-ids 1,2,3 --max-tokens 2 --ids >"$TMP/gen.out" 2>&1 || fail "generate $run: $(cat "$TMP/gen.out")"

mkdir -p "$TMP/empty/checkpoints"
expect_error "a run directory without checkpoints" \
	"empty: neither a committed checkpoint \(no manifest\.json\) nor a checkpoints or run directory holding one" -- \
	export "$TMP/empty" "$TMP/out"
expect_error "no such directory" "nowhere: no such directory" -- export "$TMP/nowhere" "$TMP/out"
finish
