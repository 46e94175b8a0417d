#!/usr/bin/python3
"""Check a directory written by `slicetrain export` the way its users will read it.

Usage:
  PYTHON tests/hf/hf_check.py --model DIR --tokens T.npy --loss X [--rel 1e-5] [--require-transformers]

DIR is loaded with Hugging Face transformers (LlamaForCausalLM.from_pretrained,
offline, from the local directory only), cast to float64, and the mean
cross-entropy of tokens[:, 1:] given tokens[:, :-1] is compared with X, the
loss slicetrain computed on the same tokens (relative tolerance --rel).
config.json is checked against the tensors' shapes, and every tensor of the
safetensors files (through the index when sharded) must be one of the
LlamaForCausalLM weights, F32, with the shape the config implies.

When transformers cannot be imported (it is not a Debian package; the test
setup installs it into .venv-test from PyPI), the script says why and falls
back to reading the files with the `safetensors` package (or a plain reader),
the config check above, and the float64 Llama of tests/parity/torch_oracle.py
for the loss -- unless --require-transformers is given, then it fails.
Exit status 0 when every check holds.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(msg):
    print(f"hf_check: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def expected_shapes(cfg):
    E, M, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, K, L = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]
    D = cfg.get("head_dim", E // H)
    out = {"model.embed_tokens.weight": (V, E), "model.norm.weight": (E,), "lm_head.weight": (V, E)}
    for i in range(L):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": (E,), p + "post_attention_layernorm.weight": (E,),
            p + "self_attn.q_proj.weight": (H * D, E), p + "self_attn.k_proj.weight": (K * D, E),
            p + "self_attn.v_proj.weight": (K * D, E), p + "self_attn.o_proj.weight": (E, H * D),
            p + "mlp.gate_proj.weight": (M, E), p + "mlp.up_proj.weight": (M, E), p + "mlp.down_proj.weight": (E, M),
        })
    return out


def check_config(cfg):
    want = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "torch_dtype": "float32"}
    for k, v in want.items():
        if cfg.get(k) != v:
            fail(f"config.json: {k} is {cfg.get(k)!r}, expected {v!r}")
    for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "num_hidden_layers", "vocab_size", "max_position_embeddings"):
        if not isinstance(cfg.get(k), int) or cfg[k] <= 0:
            fail(f"config.json: {k} must be a positive integer, got {cfg.get(k)!r}")
    for k in ("rms_norm_eps", "rope_theta"):
        if not isinstance(cfg.get(k), (int, float)) or cfg[k] <= 0:
            fail(f"config.json: {k} must be a positive number, got {cfg.get(k)!r}")
    rs = cfg.get("rope_scaling")
    if rs is not None:
        for k in ("rope_type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if k not in rs:
                fail(f"config.json: rope_scaling lacks {k}")
        if rs["rope_type"] != "llama3":
            fail(f"config.json: rope_scaling.rope_type {rs['rope_type']!r}, expected 'llama3'")


def read_tensors(model_dir):
    """{name: np.ndarray float32} from model.safetensors or the index and its shards."""
    try:
        from safetensors.numpy import load_file
        reader, how = (lambda p: load_file(p)), "safetensors package"
    except ImportError:
        sys.path.insert(0, os.path.join(HERE, "..", "parity"))
        import torch_oracle
        reader, how = (lambda p: torch_oracle.read_safetensors(p)[0]), "plain reader (no safetensors package)"
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            idx = json.load(f)
        files = sorted(set(idx["weight_map"].values()))
        out = {}
        for fn in files:
            part = reader(os.path.join(model_dir, fn))
            for n in part:
                if idx["weight_map"].get(n) != fn:
                    fail(f"{fn} holds {n}, which the index puts in {idx['weight_map'].get(n)}")
            out.update(part)
        size = sum(a.nbytes for a in out.values())
        if idx["metadata"]["total_size"] != size:
            fail(f"index total_size {idx['metadata']['total_size']} != {size} bytes of tensors")
        if set(idx["weight_map"]) != set(out):
            fail("index weight_map and the shards' tensors differ")
    else:
        out = reader(os.path.join(model_dir, "model.safetensors"))
    return out, how


def check_tensors(tensors, cfg):
    want = expected_shapes(cfg)
    if set(tensors) != set(want):
        fail(f"tensors differ from LlamaForCausalLM's: extra {sorted(set(tensors) - set(want))[:3]}, "
             f"missing {sorted(set(want) - set(tensors))[:3]}")
    for n, a in tensors.items():
        if tuple(a.shape) != want[n] or a.dtype != np.float32:
            fail(f"{n}: {a.dtype} {tuple(a.shape)}, expected float32 {want[n]}")


def loss_transformers(model_dir, tokens):
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(model_dir, local_files_only=True, torch_dtype=torch.float32,
                                             attn_implementation="eager")
    model = model.double().eval()
    x = torch.from_numpy(tokens.astype(np.int64))
    with torch.no_grad():
        logits = model(input_ids=x[:, :-1]).logits
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1)).item()


def loss_oracle(tensors, cfg, tokens):
    sys.path.insert(0, os.path.join(HERE, "..", "parity"))
    import torch_oracle
    c = {"emb": cfg["hidden_size"], "layers": cfg["num_hidden_layers"], "heads": cfg["num_attention_heads"],
         "kv_heads": cfg["num_key_value_heads"], "head_dim": cfg["head_dim"], "mlp": cfg["intermediate_size"],
         "vocab": cfg["vocab_size"], "rope_theta": float(cfg["rope_theta"]), "norm_eps": float(cfg["rms_norm_eps"])}
    rs = cfg.get("rope_scaling")
    llama31 = None if rs is None else dict(factor=rs["factor"], low=rs["low_freq_factor"],
                                           high=rs["high_freq_factor"], original_max=rs["original_max_position_embeddings"])
    loss, _ = torch_oracle.loss_and_grads(c, tensors, torch.from_numpy(tokens.astype(np.int64)), llama31)
    return loss


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--loss", type=float, required=True)
    p.add_argument("--rel", type=float, default=1e-5)
    p.add_argument("--require-transformers", action="store_true")
    a = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    check_config(cfg)
    tensors, how = read_tensors(a.model)
    check_tensors(tensors, cfg)
    tokens = np.load(a.tokens)
    try:
        import transformers
        ref, who = loss_transformers(a.model, tokens), f"transformers {transformers.__version__} LlamaForCausalLM"
    except ImportError as e:
        if a.require_transformers:
            fail(f"transformers cannot be imported ({e}); run scripts/install-deps.sh --test")
        print(f"hf_check: transformers cannot be imported ({e}); checking with {how} and "
              f"tests/parity/torch_oracle.py instead", file=sys.stderr)
        ref, who = loss_oracle(tensors, cfg, tokens), "torch_oracle (float64)"
    rel = abs(ref - a.loss) / max(abs(ref), 1e-30)
    print(f"hf_check: {who}: loss {ref:.10f}, slicetrain {a.loss:.10f}, relative difference {rel:.2e} "
          f"({len(tensors)} tensors read with {how})")
    if not math.isfinite(ref) or rel > a.rel:
        fail(f"loss differs by {rel:.2e} (> {a.rel})")


if __name__ == "__main__":
    main()
