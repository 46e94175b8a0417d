# MaxText's own v0.2.1 base.yml loads unchanged with the tutorial's overrides:
# the llama3-8b shape and MaxText's FLOPs are printed at start; with small
# override_model_config overrides it trains here; an impossible mesh is
# refused in MaxText's words.
. "$(dirname "$0")/../cli_lib.sh"
mt="$ST_ROOT/../shared/fixtures/maxtext-v0.2.1/base.yml"
[ -f "$mt" ] || skip_dep "$mt not present (shared fixtures)"
tut=(base_output_directory="$TMP/data/" dataset_type=synthetic steps=3 run_name=rayjob-test)

# llama3-8b at the tutorial's shape: resolved and priced, then refused for memory on one CPU device
"$SLICETRAIN" train "$mt" "${tut[@]}" model_name=llama3-8b per_device_batch_size=1 max_target_length=2048 >"$TMP/out" 2>"$TMP/err"
status_is "llama3-8b on one device (does not fit)" $? 1 "$TMP/err"
grep -q '8030261248' "$TMP/err" || fail "llama3-8b parameter count not printed"
grep -q '32 layers' "$TMP/err" || fail "layers not printed"
grep -q 'heads 32 (kv 8)' "$TMP/err" || fail "heads not printed"
grep -q 'Total TFLOPs: 95.5' "$TMP/err" || fail "MaxText's 95.5 TFLOPs per step not printed: $(grep TFLOPs "$TMP/err")"
grep -q 'needs .* GiB' "$TMP/err" || fail "no clear memory error"
grep -q 'bf16 activations and products' "$TMP/err" || fail "MaxText's default dtype=bfloat16 should run bf16 products"
cat "$TMP/err"

# small override_model_config shape trains
"$SLICETRAIN" train "$mt" "${tut[@]}" model_name=llama3-8b override_model_config=true base_emb_dim=64 \
	base_num_query_heads=4 base_num_kv_heads=2 base_mlp_dim=128 base_num_decoder_layers=2 head_dim=16 \
	vocab_size=512 per_device_batch_size=2 max_target_length=32 learning_rate=1e-3 >"$TMP/out" 2>"$TMP/err" \
	|| fail "small override run failed: $(tail -2 "$TMP/err")"
[ "$(grep -c '^completed step' "$TMP/out")" -eq 3 ] || fail "small override run did not print 3 steps"
cat "$TMP/out"

# the tutorial's 16-device mesh cannot be one process
expect_error "tutorial mesh on one device" "Number of devices per slice 1 does not match the product of the ICI parallelism 16" \
	-- train "$mt" "${tut[@]}" model_name=llama3-test ici_fsdp_parallelism=4 ici_tensor_parallelism=4
finish
