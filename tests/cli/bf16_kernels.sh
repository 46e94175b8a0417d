# bf16 by measured rate (bf16_kernels, docs/model.md): with dtype=bfloat16
# and bf16_kernels=auto rank 0 times both kernels per product site and logs
# the plan in its explicit form; rerunning with that explicit plan gives the
# same losses bit for bit; the plan is stored in the checkpoint and a run
# resumed with auto reuses it (and ends on the uninterrupted run's weights,
# byte for byte); a mixed plan under FSDP and tensor parallelism stays
# within 1e-2 of its single-process run; an elastic run with that plan whose
# slice 1 is killed and comes back (the returning worker takes the plan with
# the state from its peer) ends on the fault-free run's weights bit for bit;
# malformed values exit 2. Skipped (77) on CPUs without AVX512_BF16.
# timeout: 300
. "$(dirname "$0")/../cli_lib.sh"
. "$ST_ROOT/tests/mesh_lib.sh"
. "$ST_ROOT/tests/cli/elastic_lib.sh"
grep -qw avx512_bf16 /proc/cpuinfo || skip_hw "bf16 needs AVX512_BF16 (no avx512_bf16 in /proc/cpuinfo)"
MESH_EXPORT=0
common=("$ST_ROOT/configs/base.yml" model_name=llama3-test steps=10 learning_rate=1e-3 warmup_steps_fraction=0
	dataset_type=synthetic base_output_directory="$TMP/o" max_target_length=64 dtype=bfloat16 log_period=1
	checkpoint_period=5 learning_rate_schedule_steps=10)
export OMP_NUM_THREADS=1

# auto: timed, logged, and the logged plan repeats the run exactly
mesh_single auto per_device_batch_size=4
grep -q 'bf16 kernels timed on this CPU' "$TMP/auto.out" || fail "auto: no timing line"
plan=$(sed -n 's/.*to repeat: bf16_kernels=//p' "$TMP/auto.out")
[ -n "$plan" ] || fail "auto: no plan logged"
echo "auto plan: $plan"
mesh_single explicit per_device_batch_size=4 bf16_kernels="$plan"
grep -q 'bf16 kernels from the bf16_kernels key' "$TMP/explicit.out" || fail "explicit: the key's plan not used"
grep -q 'timed on this CPU' "$TMP/explicit.out" && fail "explicit: timed although the plan was given"
same_losses "auto vs its logged plan" "$TMP/auto.jsonl" "$TMP/explicit.jsonl" 10

# a mixed plan: stored in the checkpoint, reused by a resumed run with auto
mixed=q:fp32,kv:bf16,o:fp32,gate_up:bf16,down:fp32,logits:fp32,d_down:bf16,d_gate_up:fp32,d_o:bf16,d_q:fp32
mixed=$mixed,d_kv:bf16,d_logits:fp32,w_down:bf16,w_gate_up:fp32,w_o:bf16,w_q:fp32,w_kv:bf16,w_logits:bf16,attn:fp32,d_attn:bf16
mesh_single mixed per_device_batch_size=4 bf16_kernels="$mixed"
cmp -s "$TMP/mixed.loss" "$TMP/auto.loss" && fail "the mixed plan gave the auto plan's losses (plan not in effect?)"
grep -q "\"bf16_kernels\": *\"$mixed\"" "$TMP/o/mixed/checkpoints/10/manifest.json" || fail "the checkpoint does not store the plan"
mesh_single half per_device_batch_size=4 bf16_kernels="$mixed" steps=5
"$SLICETRAIN" train "${common[@]}" run_name=half metrics_file="$TMP/resumed.jsonl" per_device_batch_size=4 \
	>"$TMP/resumed.out" 2>&1 || fail "resumed run failed: $(tail -2 "$TMP/resumed.out")"
grep -q 'restored step 5' "$TMP/resumed.out" || fail "did not resume from step 5"
grep -q 'bf16 kernels from the checkpoint' "$TMP/resumed.out" || fail "the resumed run did not reuse the checkpoint's plan"
grep -q 'timed on this CPU' "$TMP/resumed.out" && fail "the resumed run timed the kernels again"
{ cat "$TMP/half.jsonl" "$TMP/resumed.jsonl"; } >"$TMP/joined.jsonl"
same_losses "mixed straight vs resumed" "$TMP/mixed.jsonl" "$TMP/joined.jsonl" 10
shard=shard-00000-of-00001.safetensors
cmp -s "$TMP/o/mixed/checkpoints/10/$shard" "$TMP/o/half/checkpoints/10/$shard" || fail "resumed: final state differs"

# the mixed plan and the all-fp32 one under FSDP and tensor parallelism (ZeRO-3 weights per unit)
mesh_launch fsdp2_tensor2 1 4 per_device_batch_size=1 ici_fsdp_parallelism=2 ici_tensor_parallelism=2 \
	bf16_kernels="$mixed" && mesh_compare_losses mixed fsdp2_tensor2 1e-2
mesh_single fp32plan per_device_batch_size=4 bf16_kernels=fp32
mesh_launch fsdp2_fp32plan 1 2 per_device_batch_size=2 ici_fsdp_parallelism=2 bf16_kernels=fp32 \
	&& mesh_compare_losses fp32plan fsdp2_fp32plan 1e-2
grep -q '0 of 20 sites on the bf16 kernel' "$TMP/fsdp2_fp32plan.out" || fail "fsdp2_fp32plan: the plan is not logged"

# elastic, in place: a joiner must run the group's plan (its own default would be all-bf16)
ek=("${el_keys[@]}" steps=20 dtype=bfloat16 bf16_kernels="$mixed")
OMP_NUM_THREADS=1 "$el_ref" launch --num-slices 2 --devices-per-slice 1 -- "${ek[@]}" run_name=eref \
	>"$TMP/eref.out" 2>&1 || fail "elastic reference failed: $(tail -3 "$TMP/eref.out")"
el_start ekill --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 1 --kill 1@5 -- "${ek[@]}" run_name=ekill
el_wait ekill 90
status_is "elastic bf16 run with a kill" "$el_rc" 0 "$TMP/ekill.err"
grep -q 'state of step [0-9]* received from rank 0, no checkpoint read' "$TMP/ekill.err" ||
	fail "elastic: the returning slice was not fed by a peer"
for r in eref ekill; do
	"$SLICETRAIN" export "$TMP/o/$r/checkpoints/20" "$TMP/hf-$r" >/dev/null 2>&1 || fail "$r: export failed"
done
cmp -s "$TMP/hf-eref/model.safetensors" "$TMP/hf-ekill/model.safetensors" &&
	echo "elastic bf16 (mixed plan): killed, re-formed, grown back; final weights bit-identical" ||
	fail "elastic bf16: the final weights differ from the fault-free run's"

# malformed values
bad=("${common[@]}" per_device_batch_size=1 steps=1 enable_checkpointing=false)
expect_error "unknown site" "unknown site 'qq'" -- train "${bad[@]}" bf16_kernels=qq:bf16
expect_error "missing site" "site kv is missing" -- train "${bad[@]}" bf16_kernels=q:bf16
expect_error "bad kind" "neither bf16 nor fp32" -- train "${bad[@]}" bf16_kernels=q:fp16
expect_error "no kind" "not SITE:bf16" -- train "${bad[@]}" bf16_kernels=fast
expect_error "in plan too" "unknown site" -- plan "${bad[@]}" bf16_kernels=qq:bf16
finish
