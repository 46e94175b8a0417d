# max_num_checkpoints_to_keep holds from the start of a run: a run killed
# between a commit and its pruning left one checkpoint too many, and the next
# run removes the extra ones before it trains (here: a restart that finds its
# steps done and saves nothing still prunes to the limit, newest kept).
. "$(dirname "$0")/../cli_lib.sh"
common=("$ST_ROOT/configs/base.yml" model_name=llama3-test per_device_batch_size=1 max_target_length=32
	dataset_type=synthetic base_output_directory="$TMP/o" run_name=keep checkpoint_period=1
	async_checkpointing=false)
"$SLICETRAIN" train "${common[@]}" steps=5 max_num_checkpoints_to_keep=-1 >/dev/null 2>"$TMP/err1" ||
	fail "first run: $(tail -1 "$TMP/err1")"
committed() { "$SLICETRAIN" ckpt list "$TMP/o/keep/checkpoints" | awk '$2 == "committed" {print $1}' | tr '\n' ' '; }
[ "$(committed)" = "1 2 3 4 5 " ] || fail "first run kept '$(committed)', want all of 1..5"
"$SLICETRAIN" train "${common[@]}" steps=5 max_num_checkpoints_to_keep=2 >/dev/null 2>"$TMP/err2" ||
	fail "second run: $(tail -1 "$TMP/err2")"
grep -q 'already completed' "$TMP/err2" || fail "second run did not find its steps done"
[ "$(committed)" = "4 5 " ] || fail "after a restart with max_num_checkpoints_to_keep=2: '$(committed)', want '4 5 '"
"$SLICETRAIN" ckpt verify "$TMP/o/keep/checkpoints" >/dev/null 2>&1 || fail "the kept checkpoints do not verify"
finish
