#!/usr/bin/env bash
# The default job's data (docs/data.md, "The default job's data"), under
# data/default/: Debian's fortunes (the `fortunes` package), one document per
# fortune, every 20th held out for eval (train.jsonl, eval.jsonl), and an
# 8192-token byte-level BPE set up as Llama 3's, trained on the training
# split with PyPI's `tokenizers` in .venv-data (tokenizer.json). Then the
# token files the trainer reads, made by `slicetrain tokenize` (train.bin,
# eval.bin) when a binary is given. Idempotent: what exists is kept.
#   scripts/default-data.sh [SLICETRAIN]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/data/default
src=/usr/share/games/fortunes
if ! [ -s "$out/tokenizer.json" ] || ! [ -s "$out/train.jsonl" ] || ! [ -s "$out/eval.jsonl" ]; then
	[ -d "$src" ] || { echo "default-data: $src is missing: install Debian's fortunes package (scripts/install-deps.sh does)" >&2; exit 1; }
	venv=$root/.venv-data
	if ! "$venv/bin/python" -c 'import tokenizers' 2>/dev/null; then
		echo "creating $venv (PyPI tokenizers, to train the default job's tokenizer)"
		/usr/bin/python3 -m venv "$venv"
		"$venv/bin/pip" install -q --disable-pip-version-check tokenizers==0.20.3
	fi
	"$venv/bin/python" "$root/scripts/default_data.py" "$src" "$out" 8192
fi
st=${1:-}
[ -n "$st" ] || exit 0
for part in train eval; do
	[ -s "$out/$part.bin" ] && continue
	"$st" tokenize tokenizer_path="$out/tokenizer.json" --quiet -o "$out/$part.bin" "$out/$part.jsonl"
done
