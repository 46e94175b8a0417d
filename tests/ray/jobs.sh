# More jobs on a real local Ray cluster (docs/ray.md, deploy/README.md):
#  1. The tutorial's Llama 3 8B command, with slicetrain's trainer, the model
#     shrunk through override_model_config (2 layers, emb 128, 4 heads, 2 kv
#     heads, mlp 256, head_dim 32, vocab 512), per_device_batch_size 4 -> 1,
#     max_target_length 4096 -> 128, steps 100 -> 10, and the ICI axes
#     ici_fsdp_parallelism=4 ici_tensor_parallelism=4 -> 2 and 2 (so 4
#     devices per slice: --devices-per-host 4 on these one-host slices);
#     the rest as the tutorial has it. It ends SUCCEEDED on 2 slices x 4
#     devices (FSDP x tensor inside a slice, data across the 2 slices).
#  2. `ray job stop` of a running job: slicetrain saves at the step boundary
#     (the checkpoint of the step it stopped at is committed and verifies),
#     the job is STOPPED, no slicetrain process is left; the same command
#     again resumes from that checkpoint and ends SUCCEEDED.
#  3. A node with another run token: the group cannot form; slicetrain
#     refuses the handshake (named in the job's log); with --max-failures 0
#     the job ends FAILED. A node without a run token: the trainer refuses
#     to start slicetrain there (named); FAILED. No slicetrain process left.
# timeout: 900
. "$(dirname "$0")/lib.sh"
cluster_up --nodes 2 --cpus 1
make_workdir

# submit NAME ARGS...: `ray job submit` as the README shows, in the background;
# its output in $TMP/NAME.out, its pid in $submit
submit() {
	local name=$1; shift
	(cd "$TMP/work" && exec ray job submit --address "$ADDRESS" --working-dir . \
		--runtime-env-json '{"excludes": [".git"]}' -- python slicetrain_elastic_trainer.py "$@") >"$TMP/$name.out" 2>&1 &
	submit=$!
}
# finished NAME WANT: wait for `ray job submit` (at most 400 s); its job's status is WANT
finished() {
	local t0=$SECONDS rc id st
	while kill -0 $submit 2>/dev/null && [ $((SECONDS - t0)) -lt 400 ]; do sleep 1; done
	kill -0 $submit 2>/dev/null && { fail "$1: ray job submit still waiting after 400 s"; kill $submit; }
	wait $submit
	rc=$?
	id=$(job_id "$TMP/$1.out")
	st=$(job_status "$id")
	echo "  $1: ray job submit exit $rc; ray job status $id: $st"
	[ "$st" = "$2" ] || { fail "$1: the job is $st, want $2"; tail -20 "$TMP/$1.out" >&2; }
	ray job logs --address "$ADDRESS" "$id" 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' >"$TMP/$1.log"
	[ -z "$(st_pids)" ] || fail "$1: slicetrain processes left: $(st_pids)"
}

echo "== 1. the tutorial's Llama 3 8B command, shrunk to this machine"
eightb=(--devices-per-host 4 base.yml base_output_directory="$DATA/" dataset_type=synthetic per_device_batch_size=1
	max_target_length=128 model_name=llama3-8b override_model_config=true base_emb_dim=128 base_num_query_heads=4
	base_num_kv_heads=2 base_mlp_dim=256 base_num_decoder_layers=2 head_dim=32 vocab_size=512 steps=10
	ici_fsdp_parallelism=2 ici_tensor_parallelism=2 run_name=rayjob-elastic-8b)
echo "  ray job submit --address $ADDRESS --working-dir . --runtime-env-json '{\"excludes\": [\".git\"]}' \\"
echo "      -- python slicetrain_elastic_trainer.py ${eightb[*]}"
submit 8b "${eightb[@]}"
finished 8b SUCCEEDED
grep -E "slicetrain ray: start|slicetrain: mesh:|completed step: 9," "$TMP/8b.log" | sed -E 's/^\(([A-Za-z]+) pid=[0-9]+(, ip=[0-9.]+)?\) /(\1) /' |
	cut -c1-200 | uniq | sed 's/^/  /'
grep -q "mesh: 2 slices x 4 devices: data 2 (ici 1, dcn 2), fsdp 2 (ici 2, dcn 1), tensor 2 (ici 2, dcn 1)" "$TMP/8b.log" ||
	fail "8b: not the mesh of 2 slices x (fsdp 2 x tensor 2)"
grep -q "completed step: 9," "$TMP/8b.log" || fail "8b: no step 9 in the job's log"

echo "== 2. ray job stop: a clean stop, then the same command resumes"
run=rayjob-stop
long=(base.yml base_output_directory="$DATA/" dataset_type=synthetic per_device_batch_size=16 max_target_length=512
	model_name=llama3-test steps=100000 checkpoint_period=25 run_name=$run metrics_file="$DATA/$run.jsonl")
submit stop "${long[@]}"
at_step() { [ "$(last_step "$DATA/$run.jsonl")" -ge "$1" ]; }
wait_for 180 "step 12" at_step 12
id=$(job_id "$TMP/stop.out")
echo "  step $(last_step "$DATA/$run.jsonl") done: ray job stop $id"
t0=$EPOCHREALTIME
ray job stop --address "$ADDRESS" "$id" >"$TMP/stop-cmd.out" 2>&1 || fail "ray job stop failed: $(tail -2 "$TMP/stop-cmd.out")"
finished stop STOPPED
echo "  stopped in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}') s"
saved=$(sed -nE 's/.*slicetrain: stopping after step [0-9]+ \(signal [0-9]+\): checkpoint ([0-9]+) saved.*/\1/p' "$TMP/stop.log" | tail -1)
grep -E "stopping after step|Received SIGINT|ABORTED|abort" "$TMP/stop.log" | sed -E 's/^\(([A-Za-z]+) pid=[0-9]+(, ip=[0-9.]+)?\) /(\1) /' |
	cut -c1-160 | uniq | sed 's/^/  /'
[ -n "$saved" ] || fail "stop: slicetrain did not save at the stop"
newest=$("$SLICETRAIN" ckpt list "$DATA/$run/checkpoints" 2>/dev/null | awk '$2 == "committed" {s = $1} END {print s}')
echo "  newest checkpoint: $newest (saved at the stop: ${saved:-none}; periodic every 25)"
[ -n "$saved" ] && [ "$newest" = "$saved" ] || fail "stop: the newest checkpoint ($newest) is not the one saved at the stop ($saved)"
"$SLICETRAIN" ckpt verify "$DATA/$run/checkpoints/$newest" >"$TMP/verify.out" 2>&1 || fail "stop: ckpt verify $newest: $(tail -2 "$TMP/verify.out")"
echo "  ckpt verify $newest: $(tail -1 "$TMP/verify.out" | cut -c1-120)"
long[6]=steps=$((newest + 5))
submit resume "${long[@]}"
finished resume SUCCEEDED
first=$(grep -m1 -oE "^\(RayTrainWorker[^)]*\) completed step: [0-9]+" "$TMP/resume.log" | grep -oE "[0-9]+$")
echo "  resumed: first step $first (the checkpoint $newest), last $(last_step "$DATA/$run.jsonl")"
[ "$first" = "$newest" ] || fail "resume: the first step is $first, want $newest"

echo "== 3. a node with another run token, a node with none: refused"
umask 077
printf 'another-run-token-%s\n' "$RANDOM$RANDOM$RANDOM$RANDOM" >"$TMP/other_token"
"$CLUSTER" kill-node 2 --all | sed 's/^/  /'
"$CLUSTER" add-node 2 --token-file "$TMP/other_token" | sed 's/^/  /'
small=(--max-failures 0 --min-slices 2 base.yml base_output_directory="$DATA/" dataset_type=synthetic
	per_device_batch_size=4 max_target_length=128 model_name=llama3-test steps=20 checkpoint_period=5)
submit wrongtoken "${small[@]}" run_name=rayjob-wrong-token
finished wrongtoken FAILED
grep -oE "slicetrain: (warning|error): .*(run token|handshake).*" "$TMP/wrongtoken.log" | cut -c1-200 | sort | uniq -c | sed 's/^/  /'
grep -qE "wrong proof of the run token|refused this process's proof of the run token" "$TMP/wrongtoken.log" ||
	fail "wrongtoken: slicetrain did not refuse the other token (no handshake refusal in the job's log)"
grep -q "completed step" "$TMP/wrongtoken.log" && fail "wrongtoken: trained with a node holding another token"
"$CLUSTER" kill-node 2 --all >/dev/null
"$CLUSTER" add-node 2 --no-token | sed 's/^/  /'
submit notoken "${small[@]}" run_name=rayjob-no-token
finished notoken FAILED
grep -oE "ValueError: SLICETRAIN_TOKEN_FILE is not set on this node[^(]*" "$TMP/notoken.log" | head -1 | sed 's/^/  /'
grep -q "SLICETRAIN_TOKEN_FILE is not set on this node" "$TMP/notoken.log" || fail "notoken: the trainer did not refuse the node without a token"
grep -q "completed step" "$TMP/notoken.log" && fail "notoken: trained with a node without the token"
finish
