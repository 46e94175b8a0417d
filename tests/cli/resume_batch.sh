# A resumed run keeps the batch its checkpoint was trained with: resuming
# with another max_target_length or global batch is refused (exit 2, the
# message naming both values, nothing trained, no checkpoint written);
# resume_allow_batch_change=true resumes anyway; a change that keeps the
# global batch (per_device_batch_size 1 with gradient_accumulation_steps 2
# for 2 x 1) resumes. docs/config.md, resume_allow_batch_change.
# timeout: 60
. "$(dirname "$0")/../cli_lib.sh"
base=("$ST_ROOT/configs/base.yml" model_name=llama3-test dataset_type=synthetic learning_rate=1e-3
	checkpoint_period=2 base_output_directory="$TMP/o" run_name=r)
"$SLICETRAIN" train "${base[@]}" steps=2 per_device_batch_size=2 max_target_length=32 >"$TMP/a.out" 2>"$TMP/a.err"
status_is "the first run" $? 0 "$TMP/a.err"
ls_before=$(ls "$TMP/o/r/checkpoints")

# refused: another sequence length, another global batch
for case in "max_target_length=64 per_device_batch_size=2|trained with max_target_length 32; this run has max_target_length 64" \
	"max_target_length=32 per_device_batch_size=4|trained with a global batch of 2 sequences; this run has a global batch of 4 sequences"; do
	change=${case%%|*} want=${case#*|}
	# shellcheck disable=SC2086 # two keys
	"$SLICETRAIN" train "${base[@]}" steps=4 $change >"$TMP/b.out" 2>"$TMP/b.err"
	rc=$?
	if status_is "resume with $change" $rc 2 "$TMP/b.err"; then
		grep -q "resumes the checkpoint of step 2, $want" "$TMP/b.err" ||
			fail "resume with $change: the error does not name both values: $(tail -1 "$TMP/b.err")"
		echo "ok   resume with $change refused: $(grep 'error' "$TMP/b.err" | head -1 | cut -c1-160)"
	fi
	grep -q 'completed step' "$TMP/b.out" && fail "resume with $change: trained"
	[ "$(ls "$TMP/o/r/checkpoints")" = "$ls_before" ] || fail "resume with $change: the checkpoints changed"
done

# the same global batch another way: resumed
"$SLICETRAIN" train "${base[@]}" steps=3 per_device_batch_size=1 gradient_accumulation_steps=2 max_target_length=32 \
	>"$TMP/c.out" 2>"$TMP/c.err"
status_is "resume with the same global batch (1 x 2 micro-batches)" $? 0 "$TMP/c.err"
grep -q 'restored step 2' "$TMP/c.err" || fail "same global batch: not restored from step 2"
grep -q 'completed step: 2,' "$TMP/c.out" || fail "same global batch: step 2 not trained"

# the override
"$SLICETRAIN" train "${base[@]}" steps=4 per_device_batch_size=4 max_target_length=32 resume_allow_batch_change=true \
	>"$TMP/d.out" 2>"$TMP/d.err"
status_is "resume_allow_batch_change=true" $? 0 "$TMP/d.err"
grep -q 'completed step: 3,' "$TMP/d.out" || fail "resume_allow_batch_change: step 3 not trained"
finish
