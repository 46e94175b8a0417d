# `slicetrain plan`'s per-device total against the peak RSS of a real run of
# the same config (getrusage of the finished child: the largest process of a
# launched group): within 1.2x either way. A llama3-125m cut to 4 layers and a
# vocabulary of 16000 (53 M parameters, ~0.8 GiB planned, so that the planned
# buffers dominate the runtime's fixed cost), batch 1 x 128, one step (the
# gradients and both AdamW moments are touched by then): fp32 on one process
# without checkpointing, the same with checkpointing (the default: the
# saver's host buffer for weights and moments), ici_fsdp=2 (ZeRO-3 buffers),
# and bf16 (the bf16 weight copy; on the fp32 kernels where the CPU has no
# bf16 products). The
# plan's checkpoint line is the saver's host buffer at most (a release that
# copies everything); an async save whose writer keeps up (here the one at
# the end of the run: no release) leaves it untouched, so checkpointing adds
# at most a quarter of that line to the peak, and the run with checkpointing
# is within 1.2x of the plan without it.
# Under the sanitizers (a build with ASan, as build-san) RSS includes ASan's shadow memory and
# quarantine, so that build runs a reduced variant: the fp32 case only, and
# only the lower bound (the run holds at least the planned weights, gradients
# and AdamW state).
. "$(dirname "$0")/../cli_lib.sh"
common=("$ST_ROOT/configs/base.yml" model_name=llama3-125m override_model_config=true base_num_decoder_layers=4
	vocab_size=16000 steps=1 per_device_batch_size=1 max_target_length=128 dataset_type=synthetic
	base_output_directory="$TMP/o" enable_checkpointing=false)
san=0
grep -qa __asan_init "$SLICETRAIN" && san=1

# rss NAME DEVICES keys...: plan, run, compare (RSS_LESS: plan lines not counted)
rss() {
	local name=$1 d=$2; shift 2
	local args=("${common[@]}" run_name="$name" "$@") cmd
	"$SLICETRAIN" plan "${args[@]}" --devices-per-slice "$d" --json >"$TMP/$name.plan" 2>"$TMP/$name.err" ||
		{ fail "$name: plan failed: $(tail -1 "$TMP/$name.err")"; return; }
	if [ "$d" -eq 1 ]; then cmd=("$SLICETRAIN" train "${args[@]}")
	else cmd=("$SLICETRAIN" launch --num-slices 1 --devices-per-slice "$d" -- "${args[@]}"); fi
	OMP_NUM_THREADS=1 timeout 120 /usr/bin/python3 -c '
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:], stdout=open(sys.argv[1], "w"), stderr=subprocess.STDOUT)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)  # KiB on Linux
sys.exit(rc)' "$TMP/$name.out" "${cmd[@]}" >"$TMP/$name.rss" || { fail "$name: run failed: $(tail -2 "$TMP/$name.out")"; return; }
	grep -q 'running in float32' "$TMP/$name.out" && fail "$name: fell back to float32"
	/usr/bin/python3 - "$TMP/$name.plan" "$(cat "$TMP/$name.rss")" "$name" $san "${RSS_LESS:-}" <<'PY' || fail "$name: peak RSS is not within 1.2x of the plan"
import json, sys
p, rss, name, san = json.load(open(sys.argv[1])), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
less = sys.argv[5].split()
G = 2**30
parts = {k[:-6]: v for k, v in p.items() if k.endswith("_bytes") and k not in ("total_bytes", "memory_bytes") and v}
state = p["weights_bytes"] + p["grads_bytes"] + p["optimizer_bytes"]
total = p["total_bytes"] - sum(p.get(k + "_bytes", 0) for k in less)
r = rss / total
print(f"{name:<10} peak RSS {rss / G:.3f} GiB, plan {total / G:.3f} GiB{' without ' + ', '.join(less) if less else ''}: "
      f"ratio {r:.3f} ({', '.join(f'{k} {v / G:.3f}' for k, v in parts.items())})")
if san:
    print(f"{name:<10} sanitized build: lower bound only (RSS >= weights + gradients + AdamW state {state / G:.3f} GiB)")
    sys.exit(0 if rss >= state else 1)
sys.exit(0 if 1 / 1.2 <= r <= 1.2 else 1)
PY
}

rss fp32 1
if [ $san -eq 0 ]; then
	RSS_LESS=checkpoint rss ckpt 1 enable_checkpointing=true async_checkpointing=true
	# the host buffer is reserved (the plan counts it) but not made resident
	/usr/bin/python3 - "$TMP/fp32.rss" "$TMP/ckpt.rss" "$TMP/ckpt.plan" <<'PY' || fail "checkpointing made more of its host buffer resident than a save without a release touches"
import json, sys
a, b, line = int(open(sys.argv[1]).read()), int(open(sys.argv[2]).read()), json.load(open(sys.argv[3])).get("checkpoint_bytes", 0)
print(f"checkpointing adds {(b - a) / 2**30:.3f} GiB of peak RSS; plan's checkpoint line (at most) {line / 2**30:.3f} GiB")
sys.exit(0 if line > 0 and b - a <= 0.25 * line else 1)
PY
	rss fsdp2 2 ici_fsdp_parallelism=2
	rss bf16 1 dtype=bfloat16
fi
finish
