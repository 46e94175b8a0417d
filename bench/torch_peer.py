"""PyPI PyTorch 2.x training the same Llama 3 as slicetrain: the speed peer of bench/train_step.

Runs in .venv-bench (scripts/install-deps.sh --bench: torch pinned there). The float64
correctness oracle is ../shared/bench/torch_llama_ref.py; this script only measures speed.

    .venv-bench/bin/python bench/torch_peer.py --threads 1 --mode eager [--steps 4 --warmup 2]

Model (the shape comes from the command line; bench/train_step passes the numbers its
st_config_load gives for llama3-125m): token embedding, L decoder layers of RMSNorm ->
q/k/v (GQA) -> RoPE (half-split pairing, theta) -> F.scaled_dot_product_attention(is_causal,
enable_gqa) -> o + residual, RMSNorm -> SwiGLU MLP + residual; final RMSNorm; untied
output layer (logits_via_embedding false); mean next-token cross-entropy. No biases.
Step: forward, loss, backward, gradient clipping at 1.0 (foreach), AdamW (lr 3e-5, betas
0.9/0.95, eps 1e-8, weight decay 0.1) with fused=True (fused CPU kernel), zero_grad.
That is slicetrain's step (its config's gradient_clipping_threshold and adam_* keys).

Modes:
  eager         fp32, eager
  compile       fp32, torch.compile(model) (inductor; needs g++), the optimizer eager
  bf16          torch.autocast("cpu", bfloat16) around forward and loss, fp32 weights
                and optimizer, eager
  compile-bf16  the same under torch.compile

torch.set_num_threads(--threads) (the bench also sets OMP_NUM_THREADS). --warmup steps
(compilation, first-touch page faults, oneDNN's JIT) are run and not timed; then --steps
timed steps. In eager mode it first prints torch's own rate for y = x W^T at M=2048 N=2048
K=768 (the oneDNN rows' shape), fp32 and bf16, median of 5 calls. Prints one line per step
and a summary:
    peer: mode=... threads=... median_step_s=... tokens/s=...
"""
import argparse, os, platform, statistics, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Layer(nn.Module):
    def __init__(s, a):
        super().__init__()
        hd = a.head_dim
        s.a = a
        s.ln1 = nn.RMSNorm(a.emb, eps=a.eps)
        s.ln2 = nn.RMSNorm(a.emb, eps=a.eps)
        s.q = nn.Linear(a.emb, a.heads * hd, bias=False)
        s.k = nn.Linear(a.emb, a.kv * hd, bias=False)
        s.v = nn.Linear(a.emb, a.kv * hd, bias=False)
        s.o = nn.Linear(a.heads * hd, a.emb, bias=False)
        s.gate = nn.Linear(a.emb, a.mlp, bias=False)
        s.up = nn.Linear(a.emb, a.mlp, bias=False)
        s.down = nn.Linear(a.mlp, a.emb, bias=False)

    def forward(s, x, cos, sin):
        a = s.a
        B, T, _ = x.shape
        hd = a.head_dim
        h = s.ln1(x)
        q = s.q(h).view(B, T, a.heads, hd).transpose(1, 2)
        k = s.k(h).view(B, T, a.kv, hd).transpose(1, 2)
        v = s.v(h).view(B, T, a.kv, hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + s.o(y.transpose(1, 2).reshape(B, T, a.heads * hd))
        h = s.ln2(x)
        return x + s.down(F.silu(s.gate(h)) * s.up(h))


def rope(x, cos, sin):  # (B, H, T, D), half-split pairing (HF rotate_half), as slicetrain
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Llama(nn.Module):
    def __init__(s, a):
        super().__init__()
        s.embed = nn.Embedding(a.vocab, a.emb)
        s.layers = nn.ModuleList([Layer(a) for _ in range(a.layers)])
        s.norm = nn.RMSNorm(a.emb, eps=a.eps)
        s.lm_head = nn.Linear(a.emb, a.vocab, bias=False)  # untied
        hd = a.head_dim
        inv = 1.0 / (a.theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.outer(torch.arange(a.seq, dtype=torch.float64), inv)
        s.register_buffer("cos", torch.cat([ang.cos()] * 2, -1).float(), persistent=False)
        s.register_buffer("sin", torch.cat([ang.sin()] * 2, -1).float(), persistent=False)

    def forward(s, tokens, targets):
        x = s.embed(tokens)
        for layer in s.layers:
            x = layer(x, s.cos, s.sin)
        logits = s.lm_head(s.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def main():
    p = argparse.ArgumentParser()
    for k, v in dict(emb=768, layers=12, heads=12, kv=4, head_dim=64, mlp=2048, vocab=32000,
                     seq=512, batch=4, steps=4, warmup=2, threads=1).items():
        p.add_argument("--" + k, type=int, default=v)
    p.add_argument("--theta", type=float, default=500000.0)
    p.add_argument("--eps", type=float, default=1e-5)
    p.add_argument("--mode", choices=["eager", "compile", "bf16", "compile-bf16"], default="eager")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Llama(a)
    try:  # the fused CPU AdamW kernel (torch >= 2.4); say so if this torch lacks it
        opt = torch.optim.AdamW(model.parameters(), lr=3e-5, betas=(0.9, 0.95), eps=1e-8,
                                weight_decay=0.1, fused=True)
        optname = "AdamW(fused=True)"
    except (RuntimeError, TypeError) as e:
        print(f"peer: fused AdamW unavailable on CPU ({e}); foreach", flush=True)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-5, betas=(0.9, 0.95), eps=1e-8,
                                weight_decay=0.1, foreach=True)
        optname = "AdamW(foreach=True)"
    fwd = torch.compile(model) if a.mode.startswith("compile") else model
    bf16 = a.mode.endswith("bf16")
    g = torch.Generator().manual_seed(1)
    tok = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
    inp, tgt = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = fwd(inp, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    if a.mode == "eager":  # torch's own product rate, the shape bench/train_step gives oneDNN
        x = torch.randn(2048, 768, generator=g)
        w = torch.randn(2048, 768, generator=g)
        rates = []
        for dt in (torch.float32, torch.bfloat16):
            xd, wd = x.to(dt), w.to(dt)
            ts = []
            for i in range(7):
                t0 = time.perf_counter()
                xd @ wd.T
                if i >= 2:
                    ts.append(time.perf_counter() - t0)
            rates.append(2.0 * 2048 * 2048 * 768 / statistics.median(ts) / 1e9)
        print(f"peer_mm: fp32_GFLOP/s={rates[0]:.1f} bf16_GFLOP/s={rates[1]:.1f}", flush=True)
    nparam = sum(x.numel() for x in model.parameters())
    print(f"peer: torch {torch.__version__} python {platform.python_version()} mode={a.mode} "
          f"threads={torch.get_num_threads()} params={nparam} optimizer={optname} "
          f"mkldnn_bf16={torch.backends.mkldnn.is_available()} "
          f"cpu_capability={torch.backends.cpu.get_cpu_capability()}", flush=True)
    t0 = time.perf_counter()
    for i in range(a.warmup):
        loss = step()
        print(f"warmup {i} loss {loss:.4f} {time.perf_counter() - t0:.3f}s", flush=True)
        t0 = time.perf_counter()
    times = []
    for i in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        dt = time.perf_counter() - t0
        times.append(dt)
        print(f"step {i} loss {loss:.4f} {dt:.3f}s", flush=True)
    med = statistics.median(times)
    print(f"peer: mode={a.mode} threads={torch.get_num_threads()} median_step_s={med:.4f} "
          f"tokens/s={a.batch * a.seq / med:.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
