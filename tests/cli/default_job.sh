# The embedded default job (configs/default.yml: llama3-16m on Debian's
# fortunes, data/default/, made by scripts/install-deps.sh and `make data`)
# learns from its text: its eval loss on the held-out fortunes ends at least
# 1 nat below its first eval and below the unigram entropy of the training
# tokens (computed here from data/default/train.bin). One process with the
# main job's global batch (8 x 256 tokens: per_device_batch_size 8), 2
# threads. The 100 steps take 2-4 minutes here: that is `make
# check-default-job` (ST_DEFAULT_JOB=full). The default suite runs 10
# steps with an eval every 5 and checks that the eval loss fell; a
# sanitized build 2 steps of 2 rows and one eval of 1 batch (the same code
# path).
# timeout: 600
. "$(dirname "$0")/../cli_lib.sh"
need_python numpy
data=$ST_ROOT/data/default
[ -s "$data/train.bin" ] && [ -s "$data/eval.bin" ] ||
	skip_dep "no data/default/*.bin: scripts/install-deps.sh, then make data"
steps=10 interval=5
[ "${ST_DEFAULT_JOB:-}" = full ] && steps=100 interval=10
small=()
grep -qa __asan_init "$SLICETRAIN" && steps=2 interval=2 small=(per_device_batch_size=2 eval_steps=1)
(cd "$ST_ROOT" && OMP_NUM_THREADS=2 "$SLICETRAIN" train per_device_batch_size=8 "${small[@]}" steps=$steps eval_interval=$interval \
	base_output_directory="$TMP/o" metrics_file="$TMP/m.jsonl" enable_checkpointing=false) >"$TMP/out" 2>"$TMP/err" ||
	fail "the default job: exit $?: $(tail -3 "$TMP/err")"
grep '^eval metrics after step' "$TMP/out" | sed 's/^/    /'
/usr/bin/python3 - "$TMP/m.jsonl" "$data/train.bin" "$steps" <<'PY' || fail "the default job did not learn enough from its text"
import json, math, sys
import numpy as np
ev = [r for r in map(json.loads, open(sys.argv[1])) if "eval/avg_loss" in r]
raw = np.fromfile(sys.argv[2], dtype=np.uint8)
hdr = np.frombuffer(raw[:1024].tobytes(), dtype=np.int32)
tok = np.frombuffer(raw[1024:].tobytes(), dtype=np.uint16 if hdr[0] == 20240520 else np.uint32)
p = np.bincount(tok).astype(np.float64)
p = p[p > 0] / p.sum()
h1 = float(-(p * np.log(p)).sum())
if not ev:
    sys.exit("no eval records")
first, last = ev[0]["eval/avg_loss"], ev[-1]["eval/avg_loss"]
print(f"eval loss: first {first:.3f} (after step {ev[0]['step']}), last {last:.3f} (after step {ev[-1]['step']}); "
      f"unigram entropy of the training tokens {h1:.3f} nats; ln(vocab) {math.log(8192):.3f}")
n = int(sys.argv[3])
if n < 10:
    sys.exit(0 if math.isfinite(last) else 1)  # a sanitized build: the path, not the learning
if n < 100:
    sys.exit(0 if last < first else 1)  # the short version: it learns
sys.exit(0 if last <= first - 1.0 and last < h1 else 1)
PY
finish
