# slicetrain generate against Hugging Face transformers' greedy generate
# (tests/hf/generate_parity.py, float32): 64 new tokens, token for token, on
# a model trained here and exported (tests/hf/tiny_model.sh), from prompt
# ids and from text (our tokenizer's ids and decode against tokenizers'
# too); and on a Llama that transformers itself saved: bf16 weights in
# shards with an index, tied embeddings, Llama 3.1 RoPE scaling, grouped
# query attention. Needs .venv-test (scripts/install-deps.sh --test).
# timeout: 300
# builds: optimized
. "$(dirname "$0")/../cli_lib.sh"
py=${ST_HF_PYTHON:-$ST_ROOT/.venv-test/bin/python}
"$py" -c 'import transformers, tokenizers, safetensors, torch' 2>/dev/null \
	|| skip_dep "$py cannot import transformers, tokenizers, safetensors and torch (scripts/install-deps.sh --test)"
need_python json
SLICETRAIN="$SLICETRAIN" "$ST_ROOT/tests/hf/tiny_model.sh" "$TMP" 30 || fail "making the model"
parity() { "$py" "$ST_ROOT/tests/hf/generate_parity.py" --slicetrain "$SLICETRAIN" "$@"; }


# a Llama as transformers writes it
"$py" - "$TMP/tf" <<'PY' || fail "transformers could not write a model"
import sys, torch, transformers
from transformers import LlamaConfig, LlamaForCausalLM
transformers.logging.set_verbosity_error()
torch.manual_seed(3)
cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, num_hidden_layers=2, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=500000.0,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 32},
                  tie_word_embeddings=True, initializer_range=0.5, bos_token_id=None, eos_token_id=None)
LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(sys.argv[1], max_shard_size="100KB")
PY
ls "$TMP/tf"/model-*-of-*.safetensors >/dev/null 2>&1 && [ -f "$TMP/tf/model.safetensors.index.json" ] \
	|| fail "transformers wrote no shards"
parity "$TMP/hf" - 278,257,32,99,266 64 "$TMP/hf" "$TMP/hf/tokenizer.json" "the dog ran to café" 64 \
	"$TMP/tf" - 1,17,33,250,7 64 || fail "parity"
finish
