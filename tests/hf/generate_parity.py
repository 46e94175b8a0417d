#!/usr/bin/env python3
"""Greedy generation of `slicetrain generate` against Hugging Face transformers.

Usage:
  PYTHON tests/hf/generate_parity.py MODEL_DIR TOKENIZER PROMPT N [MODEL_DIR TOKENIZER PROMPT N ...]
         [--slicetrain BIN] [--min-match 32] [--rel 1e-5] [--threads T]

MODEL_DIR is a Hugging Face Llama directory (e.g. from `slicetrain export`);
TOKENIZER a tokenizer.json, with PROMPT the text, or "-", with PROMPT token
ids ("1,2,3"). slicetrain generates N new tokens greedily (--json); the
same prompt ids go to transformers' LlamaForCausalLM.generate (greedy,
float32, eager attention) with the same EOS ids, and the new tokens are
compared one by one. Where they first differ, transformers' logit for
slicetrain's token must be within --rel (relative) of its largest logit (a
near tie, which float32 rounding may decide either way); the comparison
stops there and at least --min-match tokens must have matched before it.
With a tokenizer, the prompt ids must be Hugging Face tokenizers' encoding
of PROMPT (after a BOS slicetrain put first), and slicetrain's text its
decode of the new ids. Prints one line with the figures per case (several
cases share one start of Python and transformers); exit 0 when every
check holds, 1 when one fails.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def fail(msg):
    print(f"generate_parity: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cases", nargs="+", metavar="MODEL_DIR TOKENIZER PROMPT N")
    p.add_argument("--slicetrain", default=os.environ.get("SLICETRAIN", "build/slicetrain"))
    p.add_argument("--min-match", type=int, default=32)
    p.add_argument("--rel", type=float, default=1e-5)
    p.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS of slicetrain (default: as set)")
    a = p.parse_args()
    if len(a.cases) % 4:
        p.error("cases come in fours: MODEL_DIR TOKENIZER PROMPT N")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    for i in range(0, len(a.cases), 4):
        model, tokenizer, prompt, n = a.cases[i:i + 4]
        check(a, model, tokenizer, prompt, int(n))


def check(a, model_dir, tokenizer, prompt, n):
    cmd = [a.slicetrain, "generate", model_dir, "--max-tokens", str(n), "--json"]
    if tokenizer == "-":
        cmd += ["--prompt-ids", prompt]
    else:
        cmd += [f"tokenizer_path={tokenizer}", "--prompt", prompt]
    env = dict(os.environ)
    if a.threads:
        env["OMP_NUM_THREADS"] = str(a.threads)
    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        fail(f"slicetrain generate exited {run.returncode}: {run.stderr.strip()[-500:]}")
    ours = json.loads(run.stdout)
    prompt_ids, our_ids, eos = ours["prompt_ids"], ours["ids"], ours["eos_ids"]

    tok = None
    if tokenizer != "-":
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(tokenizer)
        hf_prompt = tok.encode(prompt, add_special_tokens=False).ids
        extra = prompt_ids[:len(prompt_ids) - len(hf_prompt)]
        if prompt_ids[len(extra):] != hf_prompt or len(extra) > 1 or (extra and tok.id_to_token(extra[0]) not in (
                "<|begin_of_text|>", "<s>", "<|startoftext|>", "<|endoftext|>")):
            fail(f"prompt ids {prompt_ids[:20]}... are not a BOS and tokenizers' {hf_prompt[:20]}...")

    import torch
    import transformers
    from transformers import LlamaForCausalLM
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = LlamaForCausalLM.from_pretrained(model_dir, local_files_only=True, torch_dtype=torch.float32,
                                             attn_implementation="eager").eval()
    gc = model.generation_config
    gc.eos_token_id = eos if eos else None
    gc.pad_token_id = eos[0] if eos else 0
    gc.temperature, gc.top_p, gc.top_k = None, None, None
    with torch.no_grad():
        # synced_gpus=False: left unset, generate imports torch.distributed.fsdp to ask,
        # which Debian's torch 1.13 cannot import under Python 3.11
        x = torch.tensor([prompt_ids])
        t0 = time.monotonic()
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, num_beams=1,
                             output_logits=True, return_dict_in_generate=True, generation_config=gc,
                             synced_gpus=False)
    hf_secs = time.monotonic() - t0
    hf_ids = out.sequences[0, len(prompt_ids):].tolist()
    if ours["stop"] == "context":  # transformers goes on past max_position_embeddings
        hf_ids = hf_ids[:len(our_ids)]
    logits = [l[0].double() for l in out.logits]

    matched, note, smallest = 0, "", float("inf")
    for k in range(min(len(our_ids), len(hf_ids))):
        l = logits[k]
        top2 = torch.topk(l, 2).values
        gap = float((top2[0] - top2[1]) / top2[0].abs())
        if our_ids[k] != hf_ids[k]:
            rel = float((l.max() - l[our_ids[k]]) / l.max().abs())
            if rel >= a.rel:
                fail(f"new token {k}: slicetrain {our_ids[k]}, transformers {hf_ids[k]}, whose logits differ by "
                     f"{rel:.2e} relative (more than {a.rel:g}); matched {matched} before")
            note = (f"; then a near tie at token {k} (slicetrain {our_ids[k]}, transformers {hf_ids[k]}, logits "
                    f"{rel:.1e} apart): compared up to there")
            break
        matched += 1
        smallest = min(smallest, gap)
    else:
        if len(our_ids) != len(hf_ids):
            fail(f"slicetrain made {len(our_ids)} new tokens (stop: {ours['stop']}), transformers {len(hf_ids)}")
    identical = matched == len(our_ids) == len(hf_ids)
    if not identical and matched < a.min_match:
        fail(f"only {matched} new tokens matched before the near tie (at least {a.min_match} needed)")
    if identical and matched < min(a.min_match, n) and ours["stop"] != "eos":
        fail(f"only {matched} new tokens to compare")
    text = ""
    if tok is not None and identical:
        body = hf_ids[:-1] if ours["stop"] == "eos" else hf_ids
        theirs = tok.decode(body, skip_special_tokens=False)
        if ours.get("text") != theirs:
            fail(f"text differs: slicetrain {ours.get('text')!r}, tokenizers {theirs!r}")
        text = "; text identical to tokenizers' decode"
    print(f"generate parity ({model_dir}): {matched}/{len(hf_ids)} new tokens identical to transformers {transformers.__version__} "
          f"greedy generate (float32){note}; smallest top-2 logit gap among them {smallest:.1e} relative{text}; "
          f"slicetrain {ours['tokens_per_s']:.1f} tokens/s after the prompt, transformers "
          f"{len(hf_ids) / hf_secs:.1f} tokens/s with the prompt ({torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
