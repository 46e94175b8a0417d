#!/usr/bin/env python3
"""The Hugging Face `tokenizers` side of the parity tests: encodes what
`slicetrain tokenize` encodes and writes the same llm.c .bin file, so the
two files must be byte for byte equal.

  hf_ref.py TOKENIZER.json OUT.bin [--bos ID|TOKEN] [--eos ID|TOKEN] [--field text] INPUT...

INPUT: JSON lines (*.jsonl: one document per line, blank lines skipped) or a
text file (one document). Documents are encoded with encode_batch(...,
add_special_tokens=False), BOS/EOS ids added around each. Prints one JSON
line: {"bytes": N, "tokens": N, "seconds": S, "mb_s": X, "threads": RAYON_NUM_THREADS}
(the time of encode_batch alone). Also checks decode(ids) == text for every
document (byte-level BPE round-trips exactly) and writes, with --decoded
DIR, a sample of ids and HF's decode() (skip_special_tokens False and True)
for the C decoder's test.
"""
import argparse, json, os, random, struct, sys, time

from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--bos", help="an id, or a token of the tokenizer")
    ap.add_argument("--eos", help="an id, or a token of the tokenizer")
    ap.add_argument("--field", default="text")
    ap.add_argument("--decoded")
    a = ap.parse_args()
    tok = Tokenizer.from_file(a.tokenizer)
    for k in ("bos", "eos"):
        v = getattr(a, k)
        if v is not None:
            setattr(a, k, int(v) if v.isdigit() else tok.token_to_id(v))
    docs = []
    for p in a.inputs:
        if p.endswith(".jsonl"):
            with open(p, encoding="utf-8") as f:
                docs += [json.loads(l)[a.field] for l in f if l.strip(" \t\r\n")]
        else:
            with open(p, encoding="utf-8", newline="") as f:
                docs.append(f.read())
    nbytes = sum(len(d.encode()) for d in docs)
    t0 = time.perf_counter()
    enc = tok.encode_batch(docs, add_special_tokens=False)
    secs = time.perf_counter() - t0
    ids = []
    for e in enc:
        ids += ([a.bos] if a.bos is not None else []) + e.ids + ([a.eos] if a.eos is not None else [])
    vocab = tok.get_vocab_size(with_added_tokens=True)
    u16 = vocab <= 65536
    with open(a.out, "wb") as f:
        f.write(struct.pack("<3i", 20240520 if u16 else 20240801, 1 if u16 else 7, len(ids)) + bytes(1012))
        f.write(struct.pack("<%d%s" % (len(ids), "H" if u16 else "I"), *ids))
    bad = [i for i, (d, e) in enumerate(zip(docs, enc)) if tok.decode(e.ids, skip_special_tokens=False) != d]
    if bad:
        sys.exit(f"hf_ref: Hugging Face's own decode does not give back document {bad[0]}")
    if a.decoded:
        rng = random.Random(7)
        cases = []
        for e in rng.sample(enc, min(200, len(enc))):
            cut = e.ids[rng.randint(0, len(e.ids)):][:rng.randint(0, 60)]  # cuts inside characters too
            cut += [rng.randint(0, vocab + 5) for _ in range(rng.randint(0, 3))]  # and unknown ids
            cases.append({"ids": cut, "text": tok.decode(cut, skip_special_tokens=False),
                          "text_skip": tok.decode(cut, skip_special_tokens=True)})
        with open(os.path.join(a.decoded, "decode.jsonl"), "w", encoding="utf-8") as f:
            for c in cases:
                f.write(json.dumps(c) + "\n")
    print(json.dumps({"bytes": nbytes, "tokens": len(ids), "seconds": secs, "mb_s": nbytes / 1e6 / secs,
                      "threads": os.environ.get("RAYON_NUM_THREADS", "all")}))


if __name__ == "__main__":
    main()
