# Mesh comparison helpers for the shell tests (sourced after cli_lib.sh).
# A test sets the array `common` (config file and keys shared by every run;
# it must keep checkpointing on, save_checkpoint_on_completion and
# base_output_directory="$TMP/o") and MESH_STEPS (the run's steps, default 10).
# Each run NAME leaves $TMP/NAME.jsonl (metrics), $TMP/NAME.loss (losses, one
# per line, full precision) and, unless MESH_EXPORT=0, $TMP/hf-NAME (its
# final weights exported as Hugging Face safetensors).
MESH_STEPS=${MESH_STEPS:-10}
MESH_EXPORT=${MESH_EXPORT:-1}

# mesh_collect NAME: losses and exported weights of a finished run.
mesh_collect() {
	local name=$1
	metric_losses "$TMP/$name.jsonl" >"$TMP/$name.loss" || { fail "$name: no metrics"; return 1; }
	[ "$MESH_EXPORT" = 1 ] || return 0
	"$SLICETRAIN" export "$TMP/o/$name/checkpoints/$MESH_STEPS" "$TMP/hf-$name" >/dev/null 2>"$TMP/$name.export.err" ||
		{ fail "$name: export failed: $(tail -1 "$TMP/$name.export.err")"; return 1; }
}

# mesh_single NAME keys...: one process (the reference).
mesh_single() {
	local name=$1; shift
	"$SLICETRAIN" train "${common[@]}" run_name="$name" metrics_file="$TMP/$name.jsonl" "$@" \
		>"$TMP/$name.out" 2>&1 || { fail "$name: single-process run failed: $(tail -2 "$TMP/$name.out")"; return 1; }
	mesh_collect "$name"
}

# mesh_launch NAME SLICES DEVICES_PER_SLICE keys...: a worker group, 1 thread per device.
mesh_launch() {
	local name=$1 s=$2 d=$3; shift 3
	OMP_NUM_THREADS=1 "$SLICETRAIN" launch --num-slices "$s" --devices-per-slice "$d" -- "${common[@]}" \
		run_name="$name" metrics_file="$TMP/$name.jsonl" "$@" >"$TMP/$name.out" 2>&1 \
		|| { fail "$name: launch failed: $(tail -3 "$TMP/$name.out")"; return 1; }
	mesh_collect "$name"
}

# mesh_compare_losses REF NAME [TOL]: every step's loss within TOL (default
# 1e-5) relative of REF's, MESH_STEPS steps each.
mesh_compare_losses() {
	/usr/bin/python3 - "$TMP/$1.loss" "$TMP/$2.loss" "$2" "${3:-1e-5}" "$MESH_STEPS" <<'PY' ||
import sys
a = [float(x) for x in open(sys.argv[1])]; b = [float(x) for x in open(sys.argv[2])]
tol, n = float(sys.argv[4]), int(sys.argv[5])
if not len(a) == len(b) == n:
    sys.exit(f"{sys.argv[3]}: {len(a)} and {len(b)} losses, want {n}")
rel = [abs(x - y) / abs(x) for x, y in zip(a, b)]
w = max(rel)
print(f"{sys.argv[3]:<28} worst loss rel diff {w:.2e} at step {rel.index(w)} (limit {tol:g}; first {b[0]:.6f}, last {b[-1]:.6f})")
sys.exit(0 if w <= tol else 1)
PY
		fail "$2: losses differ from $1's by more than ${3:-1e-5}"
}

# mesh_compare_weights A.safetensors B.safetensors LABEL [TOL]: the same
# tensors, each |b - a| <= TOL |a| (norms; default 1e-4). F32 or F64 files.
mesh_compare_weights() {
	/usr/bin/python3 - "$1" "$2" "$3" "${4:-1e-4}" <<'PY' ||
import json, struct, sys
import numpy as np
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    dt = {"F32": np.float32, "F64": np.float64}
    return {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], dt[v["dtype"]]).astype(np.float64)
            for k, v in h.items() if k != "__metadata__"}
a, b = load(sys.argv[1]), load(sys.argv[2])
if a.keys() != b.keys():
    sys.exit(f"{sys.argv[3]}: tensor names differ: {sorted(a.keys() ^ b.keys())[:4]}")
rel = {k: np.linalg.norm(a[k] - b[k]) / np.linalg.norm(a[k]) for k in a}
k = max(rel, key=rel.get)
print(f"{sys.argv[3]:<28} worst tensor |w - w_ref| / |w_ref| {rel[k]:.2e} ({k}) over {len(a)} tensors")
sys.exit(0 if rel[k] <= float(sys.argv[4]) else 1)
PY
		fail "$3: final weights differ by more than ${4:-1e-4} of a tensor's norm"
}

# mesh_compare REF NAME: losses (1e-5) and final weights (1e-4) against REF's.
mesh_compare() {
	mesh_compare_losses "$1" "$2"
	mesh_compare_weights "$TMP/hf-$1/model.safetensors" "$TMP/hf-$2/model.safetensors" "$2"
}
