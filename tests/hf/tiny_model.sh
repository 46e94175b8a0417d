#!/usr/bin/env bash
# A small trained model to generate with, for the tests of slicetrain generate:
#
#   tests/hf/tiny_model.sh DIR [STEPS]      ($SLICETRAIN: the binary)
#
# writes DIR/tok.json (tests/text/tiny_tokenizer.py: byte-level BPE, 280 ids,
# <|begin_of_text|> 278, <|end_of_text|> 279), DIR/train.bin (a generated
# English text with accents, CJK and emoji, whose characters the tokenizer
# cuts into several byte tokens), trains llama3-test with vocab_size=280 and
# max_target_length=128 on it for STEPS steps (default 40; its checkpoint
# remembers tokenizer_path) into DIR/o/r, and exports it with the tokenizer
# beside to DIR/hf. Standard library Python only; exits non-zero on failure.
set -eu
dir=$1 steps=${2:-40}
root=$(cd "$(dirname "$0")/../.." && pwd)
: "${SLICETRAIN:?set SLICETRAIN to the slicetrain binary}"
/usr/bin/python3 "$root/tests/text/tiny_tokenizer.py" "$dir/tok.json"
/usr/bin/python3 - "$dir/text.txt" <<'PY'
import random, sys
random.seed(7)
words = ("the cat sat on the mat and the dog ran to the park while the sun was shining on the green grass "
         "café naïve 中文 😀 über").split()
with open(sys.argv[1], "w", encoding="utf-8") as f:
    for _ in range(2500):
        n = random.randint(4, 12)
        s = random.randint(0, len(words) - n)
        f.write(" ".join(words[s:s + n]) + ".\n")
PY
"$SLICETRAIN" tokenize tokenizer_path="$dir/tok.json" -o "$dir/train.bin" "$dir/text.txt" >/dev/null
"$SLICETRAIN" train "$root/configs/base.yml" model_name=llama3-test vocab_size=280 override_model_config=true \
	steps="$steps" max_target_length=128 per_device_batch_size=4 learning_rate=3e-3 dataset_type=tokens \
	dataset_path="$dir/train.bin" base_output_directory="$dir/o" run_name=r async_checkpointing=false \
	tokenizer_path="$dir/tok.json" >/dev/null 2>"$dir/train.err" || { tail -3 "$dir/train.err" >&2; exit 1; }
"$SLICETRAIN" export "$dir/o/r/checkpoints" "$dir/hf" >/dev/null 2>&1
cp "$dir/tok.json" "$dir/hf/tokenizer.json"
