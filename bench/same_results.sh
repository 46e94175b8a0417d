#!/usr/bin/env bash
# Same results from two builds: trains the same runs with each binary and
# compares what they leave. For a change that must not change numbers (a
# refactor): every step's loss, grad norm and learning rate (the metrics
# file, 17 significant digits), every checkpoint file byte for byte, and the
# checkpoint manifests with their time fields left out (each side's output
# directory, in the config they hold, read as OUT). IGNORE_KEYS=K1,K2 leaves
# those keys out of the manifests too (a config key the change adds: say so
# when reporting the result).
#
#   bench/same_results.sh BEFORE_BINARY AFTER_BINARY [OUTDIR]
#
# Runs (llama3-test with an 8192-token vocabulary on the default job's text,
# data/default/, `make data`; 4 x 128 tokens per device; a checkpoint every
# 6 steps; eval every 6 steps):
#   one     1 process, 2 threads, fp32, 12 steps
#   bf16    1 process, 2 threads, dtype=bfloat16 with a fixed kernel plan
#           (bf16 and fp32 products), 12 steps
#   mesh    2 slices x 2 devices (ici fsdp 2, dcn data 2), 1 thread each, 12 steps
#   kill    elastic, 2 slices x 1 device, slice 1 SIGKILLed after step 5 and
#           back 2 s later (re-formed in place), 30 steps paced to 0.2 s
# OUTDIR (default: a new directory under /tmp) keeps both sides' outputs;
# prints one line per run and "same results: yes" (exit 0) or the
# differences (exit 1).
set -u
[ $# -ge 2 ] || { sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
before=$(realpath "$1") after=$(realpath "$2")
out=${3:-$(mktemp -d /tmp/same-results.XXXXXX)}
for b in "$before" "$after"; do [ -x "$b" ] || { echo "same_results: no binary $b" >&2; exit 2; }; done
[ -f "$root/data/default/train.bin" ] || { echo "same_results: no data/default/train.bin (make data)" >&2; exit 2; }
keys=("$root/configs/base.yml" model_name=llama3-test override_model_config=true vocab_size=8192 dataset_type=tokens
	dataset_path="$root/data/default/train.bin" grain_eval_files="$root/data/default/eval.bin" eval_interval=6
	eval_steps=2 per_device_batch_size=4 max_target_length=128 learning_rate=1e-3 checkpoint_period=6
	enable_tensorboard=false)

# a fixed kernel plan for bf16 (bf16_kernels=auto times the kernels, and
# may choose another plan on another run): both kernels, at different sites
plan=q:bf16,kv:bf16,o:bf16,gate_up:bf16,down:fp32,logits:bf16,d_down:bf16,d_gate_up:bf16,d_o:bf16,d_q:fp32
plan+=,d_kv:bf16,d_logits:bf16,w_down:bf16,w_gate_up:bf16,w_o:fp32,w_q:bf16,w_kv:bf16,w_logits:bf16,attn:bf16,d_attn:fp32

# run SIDE NAME: one run with the side's binary into $out/SIDE/NAME
run() {
	local side=$1 name=$2 bin d
	bin=$([ "$side" = before ] && echo "$before" || echo "$after")
	d=$out/$side
	mkdir -p "$d"
	rm -rf "${d:?}/$name" "$d/$name.jsonl"
	local common=("${keys[@]}" base_output_directory="$d" run_name="$name" metrics_file="$d/$name.jsonl")
	case $name in
	one) OMP_NUM_THREADS=2 "$bin" train "${common[@]}" steps=12 ;;
	bf16) OMP_NUM_THREADS=2 "$bin" train "${common[@]}" steps=12 dtype=bfloat16 bf16_kernels="$plan" ;;
	mesh) OMP_NUM_THREADS=1 "$bin" launch --num-slices 2 --devices-per-slice 2 --threads-per-device 1 -- \
		"${common[@]}" steps=12 ici_fsdp_parallelism=2 dcn_data_parallelism=2 ;;
	kill) OMP_NUM_THREADS=1 SLICETRAIN_MIN_STEP_SECONDS=0.2 "$bin" launch --num-slices 2 --min-slices 1 \
		--devices-per-slice 1 --threads-per-device 1 --repair-delay 2 --kill 1@5 -- \
		"${common[@]}" steps=30 dcn_data_parallelism=-1 ;;
	esac >"$d/$name.out" 2>"$d/$name.err"
}

# fingerprint DIR NAME: the run's step records (without timings) and every
# checkpoint file's sha256, manifests with their time fields left out. The
# elastic run: its controller's events by kind, and its last checkpoint
# only (at which steps it shrank and grew, and so which of its earlier
# checkpoints one or two processes wrote, is a matter of timing; in-place
# re-formation makes the steps' results the same either way)
fingerprint() {
	/usr/bin/python3 - "$1" "$2" <<'PY'
import hashlib, json, os, sys
d, name = sys.argv[1], sys.argv[2]
events = []
for line in open(os.path.join(d, name + ".jsonl")):
    r = json.loads(line)
    if "event" in r:  # the elastic run's: where they fall among the records is timing
        events.append(f"event {r['event']} {r.get('step') if name != 'kill' else ''}")
        continue
    print("record", {k: v for k, v in sorted(r.items()) if not k.startswith("perf/")})
print("\n".join(events))
ignore = set(os.environ.get("IGNORE_KEYS", "").split(",")) - {""}
def strip(o):
    if isinstance(o, dict):
        return {k: strip(v) for k, v in sorted(o.items()) if "time" not in k and k != "created" and k not in ignore}
    if isinstance(o, list):
        return [strip(v) for v in o]
    return o
ck = os.path.join(d, name, "checkpoints")
if name == "kill":
    ck = os.path.join(ck, str(max(int(s) for s in os.listdir(ck) if s.isdigit())))
for root, _, files in sorted(os.walk(ck)):
    for f in sorted(files):
        p = os.path.join(root, f)
        rel = os.path.relpath(p, ck)
        if f.endswith(".json"):
            try:
                # the side's own directory (base_output_directory, metrics_file) as OUT
                print("json", rel, json.dumps(strip(json.load(open(p))), sort_keys=True).replace(d, "OUT"))
                continue
            except ValueError:
                pass
        print("file", rel, hashlib.sha256(open(p, "rb").read()).hexdigest())
PY
}

same=1
for name in one bf16 mesh kill; do
	for side in before after; do
		run "$side" "$name"
		rc=$?
		[ $rc = 0 ] || { echo "$name: the $side binary exited $rc ($(tail -1 "$out/$side/$name.err"))"; same=0; }
		fingerprint "$out/$side" "$name" >"$out/$side/$name.fp" 2>&1
	done
	n=$(grep -c '^record' "$out/before/$name.fp") f=$(grep -c '^file' "$out/before/$name.fp")
	ev=$(grep '^event' "$out/before/$name.fp" | cut -d' ' -f2 | paste -sd ' ')
	if cmp -s "$out/before/$name.fp" "$out/after/$name.fp"; then
		echo "$name: same ($n step and eval records, $f checkpoint files, manifests without time fields${ev:+; events $ev})"
	else
		echo "$name: DIFFERENT"
		diff "$out/before/$name.fp" "$out/after/$name.fp" | head -n 10 | cut -c1-200 | sed 's/^/    /'
		same=0
	fi
done
[ -n "${IGNORE_KEYS:-}" ] && echo "(left out of the manifests: $IGNORE_KEYS)"
echo "outputs: $out"
[ $same = 1 ] && echo "same results: yes" || { echo "same results: NO"; exit 1; }
