# slicetrain generate on a small model trained here (tests/hf/tiny_model.sh):
# the same tokens from the checkpoint (run, checkpoints and step directory)
# and its Hugging Face export, from --prompt and standard input, at 1 and 2
# threads; the streamed text is the decode of the ids (multi-byte characters
# cut between tokens); sampling is the same for the same seed; EOS (from
# config.json), --max-tokens and the context stop it; and every bad input
# (no model, a malformed config.json, a missing tokenizer, an empty or
# too long prompt, bad options) exits 2 with one error line.
# timeout: 180
. "$(dirname "$0")/../cli_lib.sh"
need_python json
SLICETRAIN="$SLICETRAIN" "$ST_ROOT/tests/hf/tiny_model.sh" "$TMP" 30 || fail "making the model"
ck="$TMP/o/r" hf="$TMP/hf"
json_get() { /usr/bin/python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))[sys.argv[2]]; print(" ".join(map(str, v)) if isinstance(v, list) else v)' "$1" "$2"; }
gen() { "$SLICETRAIN" generate "$@" 2>"$TMP/gen.err"; }

"$SLICETRAIN" help generate >"$TMP/help" || fail "help generate: exit $?"
grep -q 'usage: slicetrain generate MODEL_DIR' "$TMP/help" && grep -q -- '--top-p' "$TMP/help" || fail "help generate: no usage"

# the same greedy tokens from every form of the model and of the prompt
gen "$ck" --prompt "the cat" --max-tokens 40 --json >"$TMP/a.json" || fail "checkpoint run dir: $(cat "$TMP/gen.err")"
want=$(json_get "$TMP/a.json" ids)
[ "$(json_get "$TMP/a.json" stop)" = max_tokens ] && [ "$(wc -w <<<"$want")" -eq 40 ] || fail "40 new tokens expected: $want"
[ "$(json_get "$TMP/a.json" prompt_ids | cut -d' ' -f1)" = 278 ] || fail "the prompt does not start with BOS"
grep -q 'tokens/s' "$TMP/gen.err" || fail "no tokens/s on stderr: $(cat "$TMP/gen.err")"
for m in "$ck/checkpoints" "$ck/checkpoints/30" "$hf"; do
	got=$(gen "$m" --prompt "the cat" --max-tokens 40 --ids) || fail "$m: $(cat "$TMP/gen.err")"
	[ "$got" = "$want" ] || fail "$m: other tokens: $got"
done
got=$(printf 'the cat\n' | gen "$hf" --max-tokens 40 --ids) && [ "$got" = "$want" ] || fail "standard input: $got"
for t in 1 2; do
	got=$(OMP_NUM_THREADS=$t gen "$hf" --prompt "the cat" --max-tokens 40 --ids) && [ "$got" = "$want" ] \
		|| fail "$t threads: other tokens"
done
echo "greedy: the same 40 tokens from the checkpoint, its export, stdin, 1 and 2 threads"

# streamed text = the decode of all the ids, multi-byte characters included
gen "$hf" --prompt "café 中" --max-tokens 100 --ignore-eos --temperature 1.5 --seed 3 >"$TMP/text" || fail "text: exit $?"
gen "$hf" --prompt "café 中" --max-tokens 100 --ignore-eos --temperature 1.5 --seed 3 --json >"$TMP/t.json" || fail "text --json"
/usr/bin/python3 - "$TMP/text" "$TMP/t.json" <<'PY' || fail "streamed text differs from the decode of its ids"
import json, sys
streamed = open(sys.argv[1], "rb").read().decode("utf-8")
j = json.load(open(sys.argv[2]))
print(f"streamed {len(streamed)} characters ({sum(ord(c) > 127 for c in streamed)} beyond ASCII) = decode of {len(j['ids'])} ids")
sys.exit(streamed != j["text"] or len(j["ids"]) != 100)
PY
# sampling: the same seed, the same tokens; another seed, others
a=$(gen "$hf" --prompt "the" --max-tokens 40 --temperature 1.2 --top-p 0.9 --seed 5 --ids)
b=$(gen "$hf" --prompt "the" --max-tokens 40 --temperature 1.2 --top-p 0.9 --seed 5 --ids)
c=$(gen "$hf" --prompt "the" --max-tokens 40 --temperature 1.2 --top-p 0.9 --seed 6 --ids)
[ -n "$a" ] && [ "$a" = "$b" ] || fail "sampling: the same seed gave other tokens"
[ "$a" != "$c" ] || fail "sampling: seeds 5 and 6 gave the same 40 tokens"

# EOS from config.json: the first greedy token made EOS stops after it; --ignore-eos goes on
first=${want%% *}
cp -r "$hf" "$TMP/eos"
/usr/bin/python3 - "$TMP/eos/config.json" "$first" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["eos_token_id"] = [int(sys.argv[2]), 3]; json.dump(c, open(sys.argv[1], "w"))
PY
gen "$TMP/eos" --prompt "the cat" --json >"$TMP/e.json" || fail "eos: $(cat "$TMP/gen.err")"
[ "$(json_get "$TMP/e.json" stop)" = eos ] && [ "$(json_get "$TMP/e.json" ids)" = "$first" ] \
	&& [ -z "$(json_get "$TMP/e.json" text)" ] || fail "EOS $first: $(cat "$TMP/e.json")"
[ "$(json_get "$TMP/e.json" eos_ids)" = "$first 3 279" ] || fail "EOS ids: $(json_get "$TMP/e.json" eos_ids)"
[ -z "$(gen "$TMP/eos" --prompt "the cat")" ] || fail "EOS printed text"
got=$(gen "$TMP/eos" --prompt "the cat" --max-tokens 40 --ignore-eos --ids) && [ "$got" = "$want" ] || fail "--ignore-eos"

# the context: max_position_embeddings 8 holds prompt and new tokens
cp -r "$hf" "$TMP/short"
rm "$TMP/short/tokenizer.json"
sed -i 's/"max_position_embeddings": [0-9]*/"max_position_embeddings": 8/' "$TMP/short/config.json"
gen "$TMP/short" --prompt-ids 278,257,32,99,266 --max-tokens 10 --json >"$TMP/c.json" || fail "context: $(cat "$TMP/gen.err")"
[ "$(json_get "$TMP/c.json" stop)" = context ] && [ "$(json_get "$TMP/c.json" new_tokens)" = 3 ] \
	|| fail "context of 8 after 5 prompt tokens: $(cat "$TMP/c.json")"
got=$(gen "$TMP/short" --prompt-ids 278,257,32,99,266 --max-tokens 3) && [ "$got" = "$(cut -d' ' -f1-3 <<<"$want")" ] \
	|| fail "no tokenizer: ids expected, got '$got'"

# bad input: exit 2, one error line
mkdir "$TMP/empty" "$TMP/badcfg"
cp "$hf/model.safetensors" "$TMP/badcfg/"
bad_config() { # NAME PYTHON-EXPRESSION-ON-c PATTERN
	/usr/bin/python3 -c "import json,sys; c=json.load(open(sys.argv[1])); $2; json.dump(c, open(sys.argv[2], 'w'))" \
		"$hf/config.json" "$TMP/badcfg/config.json"
	expect_error "config.json: $1" "$3" -- generate "$TMP/badcfg" --prompt-ids 1,2
}
expect_error "no MODEL_DIR" "needs a MODEL_DIR" -- generate --prompt x
expect_error "missing directory" "no such directory" -- generate "$TMP/nonexistent" --prompt x
expect_error "no model" "no model here" -- generate "$TMP/empty" --prompt x
expect_error "two models" "one MODEL_DIR" -- generate "$hf" "$ck" --prompt x
printf '{"hidden_size": 64,' >"$TMP/badcfg/config.json"
expect_error "config.json: not JSON" "config.json:1: not JSON" -- generate "$TMP/badcfg" --prompt-ids 1
bad_config "no hidden_size" 'del c["hidden_size"]' 'no "hidden_size"'
bad_config "layers a string" 'c["num_hidden_layers"]="2"' '"num_hidden_layers" must be a positive integer'
bad_config "gelu" 'c["hidden_act"]="gelu"' '"hidden_act" must be "silu"'
bad_config "mistral" 'c["model_type"]="mistral"' '"model_type" must be "llama"'
bad_config "biases" 'c["attention_bias"]=True' '"attention_bias" must be false'
bad_config "linear rope" 'c["rope_scaling"]={"rope_type": "linear", "factor": 2.0}' '"linear" is not supported'
bad_config "kv heads" 'c["num_key_value_heads"]=3' 'not a multiple of num_key_value_heads'
bad_config "shape of the weights" 'c["intermediate_size"]=64' 'mlp.gate_proj.weight has 2 dimension'
rm "$TMP/badcfg/model.safetensors"
bad_config "no weights" 'pass' 'no model.safetensors'
expect_error "no tokenizer" "needs a tokenizer" -- generate "$TMP/short" --prompt "the cat"
expect_error "missing tokenizer" "none.json" -- generate "$ck" tokenizer_path="$TMP/none.json" --prompt "the cat"
expect_error "bad tokenizer" "text.txt:1:3: not valid JSON" -- generate "$ck" tokenizer_path="$TMP/text.txt" --prompt "the cat"
expect_error "empty prompt" "the prompt is empty" -- generate "$hf" --prompt ""
expect_error "empty stdin" "the prompt is empty" -- generate "$hf"
expect_error "invalid UTF-8" "the prompt: invalid UTF-8 at byte 2" -- generate "$hf" --prompt $'ab\xffc'
expect_error "prompt too long" "the prompt has 9 tokens, and the model's context is 8 \(max_position_embeddings" \
	-- generate "$TMP/short" --prompt-ids 1,2,3,4,5,6,7,8,9
expect_error "id outside the vocabulary" "token id 280 is outside the model's vocabulary" -- generate "$hf" --prompt-ids 1,280
expect_error "not an id" "'x' is not a token id" -- generate "$hf" --prompt-ids 1,x
expect_error "no ids" "no ids" -- generate "$hf" --prompt-ids ,
expect_error "both prompts" "give one" -- generate "$hf" --prompt a --prompt-ids 1
expect_error "temperature" "temperature -1: must be a finite number >= 0" -- generate "$hf" --prompt a --temperature -1
expect_error "top-p 0" "top_p 0: must be in" -- generate "$hf" --prompt a --temperature 1 --top-p 0
expect_error "top-p text" "--top-p needs a number, got 'x'" -- generate "$hf" --prompt a --top-p x
expect_error "max-tokens 0" "--max-tokens needs a whole number >= 1" -- generate "$hf" --prompt a --max-tokens 0
expect_error "unknown option" "unknown option '--nope'" -- generate "$hf" --prompt a --nope
expect_error "unknown key" "unknown" -- generate "$hf" --prompt a no_such_key=1
finish
