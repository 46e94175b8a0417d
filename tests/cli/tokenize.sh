# slicetrain tokenize with a small tokenizer made here (tests/text/tiny_tokenizer.py,
# standard library only): text and JSON lines -> uint16 llm.c .bin with BOS/EOS,
# the same bytes at 1, 2 and 3 threads (a text file cut into pieces), the
# trainer reads it; every bad input (tokenizer, UTF-8, empty, a JSON line
# without the field, arguments) exits 2 with one error line and leaves no
# file, an earlier OUT.bin untouched; SIGTERM/SIGINT exit 128+N and leave no file.
# timeout: 120
. "$(dirname "$0")/../cli_lib.sh"
need_python json
T="$ST_ROOT/tests/text"
/usr/bin/python3 "$T/tiny_tokenizer.py" "$TMP/tok.json"
/usr/bin/python3 "$T/tiny_tokenizer.py" "$TMP/nospecial.json" --no-specials
/usr/bin/python3 "$T/tiny_tokenizer.py" "$TMP/nomodel.json" --broken no-model
/usr/bin/python3 "$T/tiny_tokenizer.py" "$TMP/badmerge.json" --broken bad-merge
/usr/bin/python3 "$T/tiny_tokenizer.py" "$TMP/notjson.json" --broken not-json
tok=tokenizer_path="$TMP/tok.json"

# the inputs: a JSON lines file (field "content", a blank line, escapes), a
# text file of ~700 KB (cut into pieces of 256 KB), and reading them back
/usr/bin/python3 - "$TMP" <<'PY'
import json, sys
d = sys.argv[1]
docs = ["the cat and the dog", "", "naïve café 中文 😀", "tab\tnew\nline\r\n", "<|end_of_text|> inside", "x" * 3000]
with open(d + "/in.jsonl", "w") as f:
    for i, t in enumerate(docs):
        f.write(json.dumps({"id": i, "content": t}) + "\n" + ("\n" if i == 2 else ""))
words = "the of and to in is was that for it with as his on be at by had are but".split()
text = "".join(words[(i * 7) % len(words)] + (".\n" if i % 11 == 0 else " ") for i in range(150_000))
text += "中文" * 40_000 + "  \n\n" + "y" * 2000  # long pieces across the cuts
open(d + "/big.txt", "w").write(text)
PY
read_bin() { /usr/bin/python3 -c '
import struct, sys
b = open(sys.argv[1], "rb").read()
magic, ver, n = struct.unpack("<3i", b[:12])
ids = struct.unpack("<%dH" % n, b[1024:]) if magic == 20240520 else struct.unpack("<%dI" % n, b[1024:])
print(magic, ver, n, ids[0], ids[-1], sum(1 for i in ids if i == 278), sum(1 for i in ids if i == 279))' "$1"; }
# ids: bytes 0-255, 22 merges (256-277), <|begin_of_text|> 278, <|end_of_text|> 279

"$SLICETRAIN" help tokenize >"$TMP/help" || fail "help tokenize: exit $?"
grep -q 'usage: slicetrain tokenize' "$TMP/help" && grep -q 'add_bos' "$TMP/help" || fail "help tokenize: no usage"

"$SLICETRAIN" tokenize "$tok" -o "$TMP/j.bin" --text-field content --threads 2 "$TMP/in.jsonl" >"$TMP/out" 2>"$TMP/err" \
	|| fail "jsonl: exit $?: $(cat "$TMP/err")"
grep -q '6 documents' "$TMP/out" || fail "jsonl: summary: $(cat "$TMP/out")"
grep -qE 'tokens/s' "$TMP/out" || fail "jsonl: no tokens/s in the summary"
# 6 documents: 6 BOS, 6 EOS plus the one in the text; starts with BOS, ends with EOS
r=$(read_bin "$TMP/j.bin")
[ "$(cut -d' ' -f1,4,5,6,7 <<<"$r")" = "20240520 278 279 6 7" ] || fail "jsonl: uint16 file with BOS/EOS expected, got $r"
"$SLICETRAIN" tokenize "$tok" add_bos=false add_eos=false -o "$TMP/n.bin" --text-field content "$TMP/in.jsonl" >/dev/null \
	|| fail "add_bos=false add_eos=false: exit $?"
r=$(read_bin "$TMP/n.bin")
[ "$(cut -d' ' -f6,7 <<<"$r")" = "0 1" ] || fail "add_bos=false add_eos=false: only the EOS in the text expected, got $r"
"$SLICETRAIN" tokenize "$tok" -o "$TMP/n.bin" --format text "$TMP/in.jsonl" >/dev/null || fail "--format text: exit $?"
[ "$(read_bin "$TMP/n.bin" | cut -d' ' -f6)" = 1 ] || fail "--format text: one document expected"

for t in 1 2 3; do
	"$SLICETRAIN" tokenize "$tok" -o "$TMP/big$t.bin" --threads $t "$TMP/big.txt" >"$TMP/out" 2>"$TMP/err" \
		|| fail "big.txt, $t threads: exit $?: $(cat "$TMP/err")"
done
cmp -s "$TMP/big1.bin" "$TMP/big2.bin" && cmp -s "$TMP/big1.bin" "$TMP/big3.bin" || fail "big.txt: output differs with the thread count"
echo "big.txt: $(read_bin "$TMP/big1.bin" | cut -d' ' -f3) tokens, the same at 1, 2 and 3 threads"
# two inputs: the concatenation of their files' documents
"$SLICETRAIN" tokenize "$tok" -o "$TMP/two.bin" --text-field content "$TMP/in.jsonl" "$TMP/big.txt" >/dev/null || fail "two inputs: exit $?"
[ "$(read_bin "$TMP/two.bin" | cut -d' ' -f6)" = 7 ] || fail "two inputs: 7 documents expected"

# the trainer reads the file; export puts the run's tokenizer beside the model
"$SLICETRAIN" train "$ST_ROOT/configs/base.yml" model_name=llama3-test vocab_size=280 override_model_config=true steps=2 max_target_length=32 \
	per_device_batch_size=2 dataset_type=tokens dataset_path="$TMP/big1.bin" "$tok" \
	base_output_directory="$TMP/o" run_name=t >"$TMP/out" 2>"$TMP/err" || fail "train on the token file: exit $?: $(tail -2 "$TMP/err")"
[ "$(grep -c '^completed step' "$TMP/out")" -eq 2 ] || fail "train on the token file: 2 steps expected"
"$SLICETRAIN" export "$TMP/o/t/checkpoints" "$TMP/hf" >/dev/null 2>"$TMP/export.err" || fail "export: $(tail -1 "$TMP/export.err")"
cmp -s "$TMP/hf/tokenizer.json" "$TMP/tok.json" || fail "export: no copy of the run's tokenizer.json beside the model"

# bad input: exit 2, one error line, no OUT.bin and no temporary
printf '{"content": "a"}\n{"content": "b"}\n{"text": "c"}\n' >"$TMP/missing.jsonl"
printf '{"content": 5}\n' >"$TMP/number.jsonl"
printf '{"content": "a"}\n{"content": \n' >"$TMP/broken.jsonl"
printf '[1, 2]\n' >"$TMP/array.jsonl"
printf '\n  \n' >"$TMP/blank.jsonl"
printf 'good text\nbad \xff byte\n' >"$TMP/bad.txt"
: >"$TMP/empty.txt"
bad() { # NAME PATTERN ARGS...: exit 2 with the error, no output file left
	local name=$1 pattern=$2
	shift 2
	rm -f "$TMP"/x.bin*
	expect_error "$name" "$pattern" -- tokenize "$@"
	ls "$TMP"/x.bin* >/dev/null 2>&1 && fail "$name: left $(ls "$TMP"/x.bin*)"
	return 0
}
bad "missing field" "missing.jsonl:3: no field 'content'" "$tok" -o "$TMP/x.bin" --text-field content "$TMP/missing.jsonl"
bad "not a string" "number.jsonl:1: field 'content' is a number, not a string" "$tok" -o "$TMP/x.bin" --text-field content "$TMP/number.jsonl"
bad "not JSON" "broken.jsonl:2: not a JSON line" "$tok" -o "$TMP/x.bin" --text-field content "$TMP/broken.jsonl"
bad "not an object" "array.jsonl:1: the line is an array" "$tok" -o "$TMP/x.bin" "$TMP/array.jsonl"
bad "blank lines only" "blank.jsonl: no JSON lines" "$tok" -o "$TMP/x.bin" "$TMP/blank.jsonl"
bad "invalid UTF-8" "bad.txt:2: invalid UTF-8 at byte 14" "$tok" -o "$TMP/x.bin" "$TMP/bad.txt"
bad "empty input" "empty.txt: empty file" "$tok" -o "$TMP/x.bin" "$TMP/empty.txt"
bad "no such input" "nothere.txt: cannot open" "$tok" -o "$TMP/x.bin" "$TMP/nothere.txt"
bad "no tokenizer_path" "needs a tokenizer: tokenizer_path" tokenizer_path= -o "$TMP/x.bin" "$TMP/bad.txt"
bad "no tokenizer file" "nothere.json: cannot open" tokenizer_path="$TMP/nothere.json" -o "$TMP/x.bin" "$TMP/big.txt"
bad "tokenizer without model" "nomodel.json: no model" tokenizer_path="$TMP/nomodel.json" -o "$TMP/x.bin" "$TMP/big.txt"
bad "tokenizer bad merge" "badmerge.json: model.merges\[22\]: the merged token 'qz' is not in model.vocab" tokenizer_path="$TMP/badmerge.json" -o "$TMP/x.bin" "$TMP/big.txt"
bad "tokenizer not JSON" "notjson.json:1:[0-9]+: not valid JSON" tokenizer_path="$TMP/notjson.json" -o "$TMP/x.bin" "$TMP/big.txt"
bad "no BOS token" "none of the BOS tokens.*add_bos=false" tokenizer_path="$TMP/nospecial.json" -o "$TMP/x.bin" "$TMP/big.txt"
bad "unknown --eos" "has no token '<nope>'" "$tok" --eos '<nope>' -o "$TMP/x.bin" "$TMP/big.txt"
bad "no -o" "needs -o OUT.bin" "$tok" "$TMP/big.txt"
bad "no input" "needs at least one INPUT" "$tok" -o "$TMP/x.bin"
bad "unknown option" "unknown option '--fast'" "$tok" --fast -o "$TMP/x.bin" "$TMP/big.txt"
bad "bad --threads" "--threads needs a positive integer" "$tok" --threads 0 -o "$TMP/x.bin" "$TMP/big.txt"
bad "bad --format" "--format 'csv'" "$tok" --format csv -o "$TMP/x.bin" "$TMP/big.txt"
bad "unknown key" "nope_key" "$tok" nope_key=1 -o "$TMP/x.bin" "$TMP/big.txt"
"$SLICETRAIN" tokenize tokenizer_path="$TMP/nospecial.json" add_bos=false add_eos=false -o "$TMP/x.bin" "$TMP/big.txt" >/dev/null \
	|| fail "no specials with add_bos=false add_eos=false: exit $?"
# an error after the first batches were written (a bad line past 8 MB) leaves no file, and an old OUT.bin as it was
/usr/bin/python3 -c '
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(90_000):
        f.write(json.dumps({"content": "the cat and the dog %d " % (i % 100) * 5}) + "\n")
    f.write("{\"other\": 1}\n")' "$TMP/late.jsonl"
cp "$TMP/j.bin" "$TMP/old.bin"
cp "$TMP/j.bin" "$TMP/keep.bin"
expect_error "error midway" "late.jsonl:90001: no field 'content'" -- tokenize "$tok" -o "$TMP/old.bin" --text-field content "$TMP/late.jsonl"
cmp -s "$TMP/old.bin" "$TMP/keep.bin" || fail "error midway: the earlier OUT.bin changed"
ls "$TMP"/old.bin.tmp* >/dev/null 2>&1 && fail "error midway: a temporary was left"

# SIGTERM and SIGINT (the input a FIFO that never ends): 128+N, no file, no temporary
for sig in TERM INT; do
	mkfifo "$TMP/fifo"
	"$SLICETRAIN" tokenize "$tok" -o "$TMP/s.bin" "$TMP/fifo" >"$TMP/out" 2>"$TMP/err" &
	pid=$!
	exec 7>"$TMP/fifo" # the writer end: tokenize reads and waits for more
	echo "some text" >&7
	for _ in $(seq 50); do ls "$TMP"/s.bin.tmp.* >/dev/null 2>&1 && break; sleep 0.1; done
	kill -s $sig $pid
	wait $pid
	rc=$?
	exec 7>&-
	want=$((128 + $(kill -l $sig)))
	[ $rc -eq $want ] || fail "SIG$sig: exit $rc, want $want: $(cat "$TMP/err")"
	grep -q "stopped by signal" "$TMP/err" || fail "SIG$sig: no message"
	ls "$TMP"/s.bin* >/dev/null 2>&1 && fail "SIG$sig: left $(ls "$TMP"/s.bin*)"
	rm -f "$TMP/fifo"
done
finish
