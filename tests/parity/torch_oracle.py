#!/usr/bin/python3
"""Float64 PyTorch oracle for the C Llama model: loss and every weight gradient.

Usage (the Debian interpreter, which imports python3-torch 1.13 and python3-numpy):

  /usr/bin/python3 tests/parity/torch_oracle.py --weights W.safetensors --tokens T.npy --out G.safetensors \
      [--rope-llama31 [--rope-scale-factor 8] [--rope-low-freq 1] [--rope-high-freq 4] [--rope-original-max 8192]]
  /usr/bin/python3 tests/parity/torch_oracle.py --train STEPS --batch G --weights W.safetensors \
      [--hf-config config.json] --tokens S.npy --out FINAL.safetensors --log LOG.jsonl \
      [--lr 3e-5] [--warmup-fraction 0.1] [--final-fraction 0.1] [--schedule-steps STEPS] \
      [--b1 0.9] [--b2 0.95] [--eps 1e-8] [--wd 0.1] [--clip 1.0]
  /usr/bin/python3 tests/parity/torch_oracle.py --selftest

W.safetensors: the model shape in __metadata__ (string values): emb, layers, heads, kv_heads,
  head_dim, mlp, vocab, rope_theta, norm_eps; the weights under Hugging Face Llama names
  (model.embed_tokens.weight (V, E), model.layers.{i}.self_attn.q_proj.weight (H*D, E), ...,
  model.norm.weight (E), lm_head.weight (V, E)), F32 (F64, F16 and BF16 are accepted too).
T.npy: int32 or int64 tokens of shape (B, T+1); inputs [:, :-1], targets [:, 1:].
G.safetensors: the F32 gradient of the mean cross-entropy over all B*T targets for every
  weight, under the weight's name, with __metadata__ {"loss": repr(float64 loss)}.
  Written to a temporary name and renamed. The loss is also printed as "loss=%.10f".

The model is the Hugging Face Llama forward (transformers LlamaForCausalLM): RMSNorm
x * rsqrt(mean(x^2) + eps) * w; rotate_half RoPE with inv_freq = 1 / theta^(arange(0, D, 2) / D)
(optionally rescaled by the Llama 3.1 rule); scores scaled by 1/sqrt(D); causal mask; GQA where
query head h reads kv head h // (H / K); SwiGLU down(silu(gate(x)) * up(x)); final RMSNorm;
untied lm_head. Everything (weights, RoPE tables, softmax, loss) is float64, so the oracle is
several orders of magnitude more precise than an fp32 implementation; gradients come from autograd.

--train runs STEPS steps of training in float64 from W, as slicetrain defines them (MaxText's
optax semantics; src/optim/adamw.h, docs/config.md), with the model shape from W's __metadata__
or from a Hugging Face config.json (--hf-config, as `slicetrain export` writes it). Step s (from 0)
trains on the mean cross-entropy of the G rows (s*G + r) mod N, r < G, of S.npy (N, T+1) (the
order of a token file without shuffling). Then, with every gradient g of the step:
  norm = |all g|; g *= clip / norm when clip > 0 and norm > clip (clip_by_global_norm)
  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  t = s + 1
  p -= lr_s * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p )   (every weight decays)
  lr_s: W = floor(schedule_steps * warmup_fraction); s < W: lr s / W (linear warmup from 0);
        s < schedule_steps: lr a + lr final_fraction (1 - a), a = (cos(pi (s-W) / (schedule_steps-W)) + 1) / 2;
        later: 0.
FINAL.safetensors: the float64 weights after the last step (F64, Hugging Face names). LOG.jsonl:
one line per step {"step", "loss", "grad_norm", "lr", "clipped"} (loss and norm before the update).

--selftest builds a tiny random model in a temporary directory, runs this script on it
(with and without Llama 3.1 RoPE scaling), and checks the result against (a) the team's
PyTorch peer model bench/torch_llama_ref.py when it can be found (ST_TORCH_LLAMA_REF,
<repo>/bench/, /work/shared/bench/), (b) central finite differences in float64, and (c) hand
evaluation of the Llama 3.1 frequency rule, and runs --train against torch.optim.AdamW with the
same schedule and clipping, and against the schedule evaluated by hand. Exit status 0 when every
check holds.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

SHAPE_INT_KEYS = ("emb", "layers", "heads", "kv_heads", "head_dim", "mlp", "vocab")
SHAPE_FLOAT_KEYS = ("rope_theta", "norm_eps")
NP_OF_DTYPE = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
               "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
DTYPE_OF_NP = {np.dtype(v): k for k, v in NP_OF_DTYPE.items()}


class InputError(Exception):
    pass


# ---------------------------------------------------------------- safetensors

def read_safetensors(path):
    """{name: np.ndarray} (BF16 widened to float32) and the metadata dict."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise InputError(f"{path}: too short for a safetensors file")
    n = struct.unpack("<Q", raw[:8])[0]
    if n > len(raw) - 8:
        raise InputError(f"{path}: header length {n} exceeds the file")
    try:
        hdr = json.loads(raw[8:8 + n])
    except ValueError as e:
        raise InputError(f"{path}: header is not valid JSON: {e}")
    if not isinstance(hdr, dict):
        raise InputError(f"{path}: header is not a JSON object")
    buf = memoryview(raw)[8 + n:]
    meta = hdr.pop("__metadata__", None) or {}
    out = {}
    for name, t in hdr.items():
        b, e = t["data_offsets"]
        if not 0 <= b <= e <= len(buf):
            raise InputError(f"{path}: tensor {name!r}: data_offsets [{b}, {e}] out of range")
        shape = tuple(t["shape"])
        if t["dtype"] == "BF16":
            arr = (np.frombuffer(buf[b:e], "<u2").astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] in NP_OF_DTYPE:
            arr = np.frombuffer(buf[b:e], np.dtype(NP_OF_DTYPE[t["dtype"]]).newbyteorder("<"))
        else:
            raise InputError(f"{path}: tensor {name!r}: unsupported dtype {t['dtype']}")
        if arr.size != math.prod(shape):
            raise InputError(f"{path}: tensor {name!r}: shape {list(shape)} does not match its {e - b} bytes")
        out[name] = arr.reshape(shape).copy()
    return out, meta


def write_safetensors(path, tensors, meta=None):
    """tensors: list of (name, np.ndarray), written in that order; meta: {str: str}."""
    hdr, blobs, off = {}, [], 0
    if meta:
        hdr["__metadata__"] = {str(k): str(v) for k, v in meta.items()}
    for name, a in tensors:
        a = np.asarray(a)  # not ascontiguousarray: it turns 0-d into 1-d
        dt = DTYPE_OF_NP[a.dtype.newbyteorder("=")]
        data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes(order="C")
        hdr[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------- model

def model_config(meta, path):
    c = {}
    for k in SHAPE_INT_KEYS + SHAPE_FLOAT_KEYS:
        if k not in meta:
            raise InputError(f"{path}: __metadata__ lacks {k!r}")
        try:
            c[k] = int(meta[k]) if k in SHAPE_INT_KEYS else float(meta[k])
        except ValueError:
            raise InputError(f"{path}: __metadata__ {k}={meta[k]!r} is not a number of the right kind")
    for k in SHAPE_INT_KEYS:
        if c[k] <= 0:
            raise InputError(f"{path}: __metadata__ {k}={c[k]} must be positive")
    if c["heads"] % c["kv_heads"]:
        raise InputError(f"{path}: heads={c['heads']} is not a multiple of kv_heads={c['kv_heads']}")
    if c["head_dim"] % 2:
        raise InputError(f"{path}: head_dim={c['head_dim']} must be even for RoPE")
    return c


def param_shapes(c):
    """[(name, shape)] of every weight, in Hugging Face order."""
    E, H, K, D, M, V = c["emb"], c["heads"], c["kv_heads"], c["head_dim"], c["mlp"], c["vocab"]
    out = [("model.embed_tokens.weight", (V, E))]
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (E,)),
                (p + "self_attn.q_proj.weight", (H * D, E)),
                (p + "self_attn.k_proj.weight", (K * D, E)),
                (p + "self_attn.v_proj.weight", (K * D, E)),
                (p + "self_attn.o_proj.weight", (E, H * D)),
                (p + "post_attention_layernorm.weight", (E,)),
                (p + "mlp.gate_proj.weight", (M, E)),
                (p + "mlp.up_proj.weight", (M, E)),
                (p + "mlp.down_proj.weight", (E, M))]
    out += [("model.norm.weight", (E,)), ("lm_head.weight", (V, E))]
    return out


def rope_inv_freq(head_dim, theta, llama31=None):
    """float64 (D/2,) inverse frequencies; llama31: dict factor, low, high, original_max or None.

    The Llama 3.1 rule (transformers' _compute_llama3_parameters): wavelengths shorter
    than original_max/high keep their frequency, those longer than original_max/low are
    slowed down by factor, and the band between is interpolated smoothly."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if not llama31:
        return inv
    factor, low, high, old = llama31["factor"], llama31["low"], llama31["high"], llama31["original_max"]
    wavelen = 2 * math.pi / inv
    low_freq_wavelen, high_freq_wavelen = old / low, old / high
    smooth = (old / wavelen - low) / (high - low)
    mid = (1 - smooth) * inv / factor + smooth * inv
    out = torch.where(wavelen > low_freq_wavelen, inv / factor, mid)
    return torch.where(wavelen < high_freq_wavelen, inv, out)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate(x, cos, sin):  # x (B, heads, T, D); cos, sin (T, D)
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def llama_loss(w, tokens, c, inv_freq):
    """Mean next-token cross-entropy; w: {name: float64 tensor}; tokens (B, T+1) int64."""
    E, H, K, D, V, eps = c["emb"], c["heads"], c["kv_heads"], c["head_dim"], c["vocab"], c["norm_eps"]
    inp, tgt = tokens[:, :-1], tokens[:, 1:]
    B, T = inp.shape
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    kv_of_head = torch.arange(H) // (H // K)
    x = F.embedding(inp, w["model.embed_tokens.weight"])
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(B, T, H, D).transpose(1, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(B, T, K, D).transpose(1, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(B, T, K, D).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k, v = k[:, kv_of_head], v[:, kv_of_head]
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        a = s.masked_fill(causal, float("-inf")).softmax(-1) @ v
        x = x + a.transpose(1, 2).reshape(B, T, H * D) @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
        x = x + g @ w[p + "mlp.down_proj.weight"].T
    logits = rms_norm(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T
    return F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))


def hf_model_config(path):
    """The model shape from a Hugging Face config.json (LlamaForCausalLM's keys)."""
    with open(path) as f:
        j = json.load(f)
    keys = dict(emb="hidden_size", layers="num_hidden_layers", heads="num_attention_heads",
                kv_heads="num_key_value_heads", mlp="intermediate_size", vocab="vocab_size",
                rope_theta="rope_theta", norm_eps="rms_norm_eps")
    meta = {k: str(j[v]) for k, v in keys.items() if v in j}
    if "head_dim" in j:
        meta["head_dim"] = str(j["head_dim"])
    elif "hidden_size" in j and "num_attention_heads" in j:
        meta["head_dim"] = str(j["hidden_size"] // j["num_attention_heads"])
    return model_config(meta, path)


def load_inputs(weights_path, tokens_path, c=None):
    """c: the model shape (else from the weights' __metadata__)."""
    arrays, meta = read_safetensors(weights_path)
    if c is None:
        c = model_config(meta, weights_path)
    shapes = param_shapes(c)
    want = {n for n, _ in shapes}
    missing = [n for n, _ in shapes if n not in arrays]
    extra = sorted(set(arrays) - want)
    if missing or extra:
        raise InputError(f"{weights_path}: weights do not match the model: missing {missing[:5]}"
                         f"{'...' if len(missing) > 5 else ''}, unexpected {extra[:5]}")
    for n, s in shapes:
        if arrays[n].shape != s:
            raise InputError(f"{weights_path}: {n} has shape {list(arrays[n].shape)}, expected {list(s)}")
        if arrays[n].dtype.kind != "f":
            raise InputError(f"{weights_path}: {n} is not floating point")
    tok = np.load(tokens_path)
    if tok.dtype not in (np.int32, np.int64):
        raise InputError(f"{tokens_path}: dtype {tok.dtype}, expected int32 or int64")
    if tok.ndim != 2 or tok.shape[1] < 2 or tok.shape[0] < 1:
        raise InputError(f"{tokens_path}: shape {list(tok.shape)}, expected (B, T+1) with B >= 1, T >= 1")
    if tok.min() < 0 or tok.max() >= c["vocab"]:
        raise InputError(f"{tokens_path}: token ids must lie in [0, {c['vocab']}), found "
                         f"[{tok.min()}, {tok.max()}]")
    return c, {n: arrays[n] for n, _ in shapes}, torch.from_numpy(tok.astype(np.int64))


def loss_and_grads(c, arrays, tokens, llama31=None):
    """float64 loss and {name: float64 gradient}, in param_shapes order."""
    w = {n: torch.tensor(a, dtype=torch.float64, requires_grad=True) for n, a in arrays.items()}
    loss = llama_loss(w, tokens, c, rope_inv_freq(c["head_dim"], c["rope_theta"], llama31))
    loss.backward()
    return loss.item(), {n: w[n].grad for n, _ in param_shapes(c)}


def scaling_from_args(a):
    if not a.rope_llama31:
        return None
    if a.rope_scale_factor <= 0 or a.rope_original_max <= 0 or a.rope_high_freq <= a.rope_low_freq:
        raise InputError("Llama 3.1 RoPE needs factor > 0, original max > 0 and high_freq > low_freq")
    return dict(factor=a.rope_scale_factor, low=a.rope_low_freq, high=a.rope_high_freq,
                original_max=a.rope_original_max)


def run(a):
    c, arrays, tokens = load_inputs(a.weights, a.tokens)
    loss, grads = loss_and_grads(c, arrays, tokens, scaling_from_args(a))
    write_safetensors(a.out, [(n, g.numpy().astype(np.float32)) for n, g in grads.items()],
                      {"loss": repr(loss)})
    print(f"loss={loss:.10f}")


# ---------------------------------------------------------------- training

def lr_at(step, h):
    """The learning rate of (0-based) step `step`: linear warmup, cosine decay, then 0."""
    n, lr = h["schedule_steps"], h["lr"]
    warm = math.floor(n * h["warmup_fraction"])
    if step >= n:
        return 0.0
    if step < warm:
        return lr * step / warm
    a = 0.5 * (math.cos(math.pi * (step - warm) / (n - warm)) + 1.0)
    return lr * a + lr * h["final_fraction"] * (1.0 - a)


def train_adamw(c, arrays, samples, h, llama31=None):
    """h: steps, batch, lr, warmup_fraction, final_fraction, schedule_steps, b1, b2, eps, wd,
    clip. Returns the per-step log and the final {name: float64 tensor}."""
    inv = rope_inv_freq(c["head_dim"], c["rope_theta"], llama31)
    names = [n for n, _ in param_shapes(c)]
    w = {n: torch.tensor(arrays[n], dtype=torch.float64, requires_grad=True) for n in names}
    m = {n: torch.zeros_like(w[n]) for n in names}
    v = {n: torch.zeros_like(w[n]) for n in names}
    N, G, log = samples.shape[0], h["batch"], []
    for step in range(h["steps"]):
        tokens = samples[[(step * G + r) % N for r in range(G)]]
        for n in names:
            w[n].grad = None
        loss = llama_loss(w, tokens, c, inv)
        loss.backward()
        norm = math.sqrt(sum(float((w[n].grad ** 2).sum()) for n in names))
        scale = h["clip"] / norm if h["clip"] > 0 and norm > h["clip"] else 1.0
        lr, t = lr_at(step, h), step + 1
        c1, c2 = 1.0 - h["b1"] ** t, 1.0 - h["b2"] ** t
        with torch.no_grad():
            for n in names:
                g = w[n].grad * scale
                m[n].mul_(h["b1"]).add_((1 - h["b1"]) * g)
                v[n].mul_(h["b2"]).add_((1 - h["b2"]) * g * g)
                w[n] -= lr * ((m[n] / c1) / ((v[n] / c2).sqrt() + h["eps"]) + h["wd"] * w[n])
        log.append({"step": step, "loss": loss.item(), "grad_norm": norm, "lr": lr, "clipped": scale < 1.0})
    return log, {n: w[n].detach() for n in names}


def train_hparams(a):
    h = dict(steps=a.train, batch=a.batch, lr=a.lr, warmup_fraction=a.warmup_fraction,
             final_fraction=a.final_fraction, schedule_steps=a.schedule_steps or a.train,
             b1=a.b1, b2=a.b2, eps=a.eps, wd=a.wd, clip=a.clip)
    if h["steps"] < 1 or h["batch"] is None or h["batch"] < 1 or h["schedule_steps"] < 1:
        raise InputError("--train and --batch must be >= 1 (and --schedule-steps, when given)")
    if not (0 <= h["warmup_fraction"] <= 1 and 0 <= h["b1"] < 1 and 0 <= h["b2"] < 1 and h["eps"] > 0
            and h["lr"] >= 0 and h["clip"] >= 0):
        raise InputError("need 0 <= warmup fraction <= 1, 0 <= b1, b2 < 1, eps > 0, lr >= 0, clip >= 0")
    return h


def run_train(a):
    if not a.log:
        raise InputError("--train needs --log")
    c = hf_model_config(a.hf_config) if a.hf_config else None
    c, arrays, samples = load_inputs(a.weights, a.tokens, c)
    log, final = train_adamw(c, arrays, samples, train_hparams(a), scaling_from_args(a))
    write_safetensors(a.out, [(n, t.numpy()) for n, t in final.items()],
                      {"losses": json.dumps([r["loss"] for r in log])})
    tmp = f"{a.log}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        for r in log:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, a.log)
    print(f"trained {len(log)} steps: loss {log[0]['loss']:.10f} -> {log[-1]['loss']:.10f}")


def selftest_train(check, d, c, arrays, me):
    """--train against torch.optim.AdamW (decoupled weight decay: the same update) with the
    schedule set by hand each step and the gradients clipped by hand."""
    rng = np.random.default_rng(99)
    samples = rng.integers(0, c["vocab"], size=(5, 8)).astype(np.int64)
    wpath, tpath = os.path.join(d, "tw.safetensors"), os.path.join(d, "ts.npy")
    opath, lpath = os.path.join(d, "tout.safetensors"), os.path.join(d, "tlog.jsonl")
    write_safetensors(wpath, list(arrays.items()), {k: str(v) for k, v in c.items()})
    np.save(tpath, samples)
    h = dict(steps=7, batch=2, lr=0.02, warmup_fraction=0.3, final_fraction=0.1, schedule_steps=6,
             b1=0.9, b2=0.95, eps=1e-8, wd=0.1, clip=0.5)
    cmd = [sys.executable, me, "--train", "7", "--batch", "2", "--weights", wpath, "--tokens", tpath,
           "--out", opath, "--log", lpath, "--lr", "0.02", "--warmup-fraction", "0.3",
           "--final-fraction", "0.1", "--schedule-steps", "6", "--clip", "0.5"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 0, f"--train exits 0 ({r.stderr.strip()[-300:]})")
    if r.returncode:
        return
    log = [json.loads(x) for x in open(lpath)]
    final, _ = read_safetensors(opath)
    # the schedule by hand: warmup floor(6 * 0.3) = 1 step, cosine over 5, then 0
    want_lr = [0.0] + [0.02 * (0.1 + 0.9 * 0.5 * (math.cos(math.pi * k / 5) + 1)) for k in range(5)] + [0.0]
    check(all(abs(x["lr"] - y) <= 1e-15 for x, y in zip(log, want_lr)) and len(log) == 7,
          f"--train schedule {[round(x['lr'], 6) for x in log]}")
    check(sum(x["clipped"] for x in log) >= 4, f"--train clipping is active ({sum(x['clipped'] for x in log)} of 7 steps)")
    # the same with torch.optim.AdamW
    names = [n for n, _ in param_shapes(c)]
    w = {n: torch.tensor(arrays[n], dtype=torch.float64, requires_grad=True) for n in names}
    opt = torch.optim.AdamW([w[n] for n in names], lr=0.0, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    inv = rope_inv_freq(c["head_dim"], c["rope_theta"])
    sam, worst_loss = torch.from_numpy(samples), 0.0
    for step in range(7):
        opt.zero_grad()
        loss = llama_loss(w, sam[[(step * 2 + r) % 5 for r in range(2)]], c, inv)
        loss.backward()
        norm = math.sqrt(sum(float((w[n].grad ** 2).sum()) for n in names))
        with torch.no_grad():
            for n in names:
                w[n].grad *= min(1.0, 0.5 / norm)
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step, h)
        opt.step()
        worst_loss = max(worst_loss, abs(loss.item() - log[step]["loss"]) / loss.item())
    worst = max(float((w[n].detach() - torch.from_numpy(final[n])).norm() / w[n].detach().norm()) for n in names)
    check(worst_loss < 1e-12 and worst < 1e-12,
          f"--train matches torch.optim.AdamW (loss rel {worst_loss:.1e}, weights rel {worst:.1e})")
    moved = min(float(np.linalg.norm(final[n] - arrays[n]) / np.linalg.norm(arrays[n])) for n in names)
    check(moved > 1e-4, f"--train moves every weight (least relative change {moved:.1e})")


# ---------------------------------------------------------------- self-test

def find_peer_model():
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.environ.get("ST_TORCH_LLAMA_REF"),
              os.path.join(here, "..", "..", "bench", "torch_llama_ref.py"),
              "/work/shared/bench/torch_llama_ref.py"):
        if p and os.path.isfile(p):
            return p
    return None


def peer_loss_and_grads(path, c, arrays, tokens, llama31):
    """The same quantities from bench/torch_llama_ref.py's nn.Module model, in float64.
    Its rope() builds float32 tables; with llama31 it is swapped for one using our
    scaled frequencies (also float32), so agreement is to about 1e-6, not 1e-12."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("torch_llama_ref", path)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    if llama31:
        def rope(x, theta):
            B, Hh, S, D = x.shape
            inv = rope_inv_freq(D, theta, llama31).float()
            ang = torch.outer(torch.arange(S, dtype=torch.float32), inv)
            cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
            x1, x2 = x[..., : D // 2], x[..., D // 2:]
            return x * cos + torch.cat([-x2, x1], -1) * sin
        ref.rope = rope
    args = argparse.Namespace(emb=c["emb"], layers=c["layers"], heads=c["heads"], kv=c["kv_heads"],
                              head_dim=c["head_dim"], mlp=c["mlp"], vocab=c["vocab"],
                              theta=c["rope_theta"], eps=c["norm_eps"])
    m = ref.Llama(args).double()
    sd = {n: torch.from_numpy(a.astype(np.float64)) for n, a in arrays.items()}
    missing, unexpected = m.load_state_dict(sd, strict=True)
    logits = m(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, c["vocab"]), tokens[:, 1:].reshape(-1))
    loss.backward()
    params = dict(m.named_parameters())
    return loss.item(), {n: params[n].grad for n in arrays}


def selftest():
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    # Llama 3.1 frequency rule, evaluated by hand for D=6, theta=1e4, original 512,
    # low 1, high 4, factor 8: wavelengths 6.3 (kept), 135.4 (smoothed), 2918.8 (divided).
    sc = dict(factor=8.0, low=1.0, high=4.0, original_max=512)
    got = rope_inv_freq(6, 10000.0, sc).tolist()
    want, bands = [], set()
    for j in range(3):
        f = 10000.0 ** (-2 * j / 6)
        wl = 2 * math.pi / f
        if wl < 512 / 4:
            want.append(f); bands.add("high")
        elif wl > 512 / 1:
            want.append(f / 8); bands.add("low")
        else:
            s = (512 / wl - 1) / 3
            want.append((1 - s) * f / 8 + s * f); bands.add("mid")
    check(bands == {"high", "mid", "low"}, "rope test case covers all three Llama 3.1 bands")
    check(all(abs(g - w) <= 1e-15 * w for g, w in zip(got, want)), f"llama3.1 inv_freq {got} == {want}")
    # wavelength 2*pi/0.0464159 = 135.367; smooth = (512/135.367 - 1)/3 = 0.927436;
    # 0.0464159 * (0.927436 + 0.072564/8) = 0.0434688
    check(abs(got[1] - 0.0434688) < 1e-5 * 0.0434688, f"smoothed band value {got[1]:.7f} == 0.0434688")
    got = rope_inv_freq(6, 10000.0).tolist()
    check(all(abs(g - w) <= 1e-15 * w for g, w in zip(got, [1.0, 10000.0 ** (-1 / 3), 10000.0 ** (-2 / 3)])),
          f"plain inv_freq {got}")

    c = dict(emb=16, layers=2, heads=4, kv_heads=2, head_dim=6, mlp=20, vocab=37,
             rope_theta=10000.0, norm_eps=1e-5)
    rng = np.random.default_rng(1234)
    arrays = {}
    for n, s in param_shapes(c):
        if n.endswith("norm.weight"):
            arrays[n] = (1 + 0.2 * rng.standard_normal(s)).astype(np.float32)
        else:
            arrays[n] = (0.35 * rng.standard_normal(s)).astype(np.float32)
    B, T = 2, 9
    tok = rng.integers(0, c["vocab"], size=(B, T + 1))
    me = os.path.abspath(__file__)

    with tempfile.TemporaryDirectory(prefix="torch_oracle_selftest.") as d:
        wpath = os.path.join(d, "w.safetensors")
        # shuffled order: readers must not depend on it
        order = list(arrays.items())
        rng.shuffle(order)
        write_safetensors(wpath, order, {k: str(v) for k, v in c.items()})

        for llama31, tdtype in ((None, np.int32), (sc, np.int64)):
            tag = "llama3.1 rope" if llama31 else "plain rope"
            tpath, gpath = os.path.join(d, "t.npy"), os.path.join(d, "g.safetensors")
            np.save(tpath, tok.astype(tdtype))
            cmd = [sys.executable, me, "--weights", wpath, "--tokens", tpath, "--out", gpath]
            if llama31:
                cmd += ["--rope-llama31", "--rope-scale-factor", "8", "--rope-low-freq", "1",
                        "--rope-high-freq", "4", "--rope-original-max", "512"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            check(r.returncode == 0, f"{tag}: oracle exits 0 ({r.stderr.strip()[-300:]})")
            if r.returncode:
                continue
            printed = float(r.stdout.strip().split("loss=")[1])

            c2, arr2, tokens = load_inputs(wpath, tpath)
            loss, grads = loss_and_grads(c2, arr2, tokens, llama31)
            g_file, g_meta = read_safetensors(gpath)
            check(list(g_file) == [n for n, _ in param_shapes(c)], f"{tag}: gradient names and order")
            check(all(g_file[n].dtype == np.float32 and g_file[n].shape == arrays[n].shape for n in arrays),
                  f"{tag}: gradients are F32 with the weight shapes")
            check(all(np.array_equal(g_file[n], grads[n].numpy().astype(np.float32)) for n in arrays),
                  f"{tag}: file holds the float64 gradients rounded to float32")
            check(g_meta.get("loss") == repr(loss) and abs(printed - loss) < 1e-9,
                  f"{tag}: loss {loss!r} in metadata and printed")
            check(abs(loss - math.log(c["vocab"])) < 3, f"{tag}: loss {loss:.4f} is plausible")

            # (a) the team's nn.Module peer model
            peer = find_peer_model()
            if peer:
                pl, pg = peer_loss_and_grads(peer, c, arrays, tokens, llama31)
                worst = max(float((pg[n] - grads[n]).abs().max() / grads[n].abs().max().clamp(min=1e-30))
                            for n in arrays)
                check(abs(pl - loss) <= 1e-6 * abs(loss), f"{tag}: peer model loss {pl:.12f} vs {loss:.12f}")
                check(worst < 1e-5, f"{tag}: peer model gradients agree (worst rel {worst:.2e})")
            else:
                print(f"skip {tag}: bench/torch_llama_ref.py not found (set ST_TORCH_LLAMA_REF)")

            # (b) central differences in float64 at the largest gradient entry of each tensor
            names = ["model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                     "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                     "model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight",
                     "model.layers.0.post_attention_layernorm.weight", "model.layers.1.mlp.gate_proj.weight",
                     "model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight",
                     "model.norm.weight", "lm_head.weight"]
            w = {n: torch.tensor(a, dtype=torch.float64) for n, a in arr2.items()}
            inv = rope_inv_freq(c["head_dim"], c["rope_theta"], llama31)
            worst, h = 0.0, 1e-5
            for n in names:
                idx = np.unravel_index(int(grads[n].abs().argmax()), grads[n].shape)
                base = w[n][idx].item()
                w[n][idx] = base + h
                lp = llama_loss(w, tokens, c, inv).item()
                w[n][idx] = base - h
                lm = llama_loss(w, tokens, c, inv).item()
                w[n][idx] = base
                fd, g = (lp - lm) / (2 * h), grads[n][idx].item()
                err = abs(fd - g) / max(abs(g), 1e-3)
                worst = max(worst, err)
                if err > 1e-6:
                    print(f"     {n}{list(idx)}: autograd {g:.12e} finite difference {fd:.12e}")
            check(worst < 1e-6, f"{tag}: finite differences on {len(names)} weights (worst rel {worst:.2e})")

            if llama31:
                plain = llama_loss({n: torch.tensor(a, dtype=torch.float64) for n, a in arr2.items()},
                                   tokens, c, rope_inv_freq(c["head_dim"], c["rope_theta"])).item()
                check(abs(plain - loss) > 1e-9, f"{tag}: scaling changes the loss ({plain:.12f} vs {loss:.12f})")

        # bad input is reported, not a traceback
        bad = os.path.join(d, "bad.npy")
        np.save(bad, np.full((1, 3), c["vocab"], np.int32))
        r = subprocess.run([sys.executable, me, "--weights", wpath, "--tokens", bad, "--out",
                            os.path.join(d, "x.safetensors")], capture_output=True, text=True)
        check(r.returncode == 2 and "token ids must lie in" in r.stderr, "out-of-range tokens are rejected")

        selftest_train(check, d, c, arrays, me)

    print("selftest: " + ("OK" if not failures else f"{len(failures)} FAILED"))
    return 0 if not failures else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights")
    p.add_argument("--tokens")
    p.add_argument("--out")
    p.add_argument("--rope-llama31", action="store_true", help="apply Llama 3.1 RoPE frequency scaling")
    p.add_argument("--rope-scale-factor", type=float, default=8.0)
    p.add_argument("--rope-low-freq", type=float, default=1.0, help="low_freq_factor")
    p.add_argument("--rope-high-freq", type=float, default=4.0, help="high_freq_factor")
    p.add_argument("--rope-original-max", type=float, default=8192,
                   help="original_max_position_embeddings")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    p.add_argument("--selftest", action="store_true", help="check the oracle itself and exit")
    p.add_argument("--train", type=int, default=0, metavar="STEPS", help="train STEPS steps (see above)")
    p.add_argument("--batch", type=int, help="--train: rows per step")
    p.add_argument("--hf-config", help="--train: the model shape from this config.json")
    p.add_argument("--log", help="--train: the per-step JSON lines")
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--warmup-fraction", type=float, default=0.1)
    p.add_argument("--final-fraction", type=float, default=0.1)
    p.add_argument("--schedule-steps", type=int, default=0, help="default: --train")
    p.add_argument("--b1", type=float, default=0.9)
    p.add_argument("--b2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0, help="global-norm clipping threshold, 0: none")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.selftest:
        sys.exit(selftest())
    if not (a.weights and a.tokens and a.out):
        p.error("--weights, --tokens and --out are required (or --selftest)")
    try:
        run_train(a) if a.train else run(a)
    except (InputError, OSError, KeyError, ValueError) as e:
        print(f"torch_oracle: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
