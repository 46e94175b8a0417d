#!/usr/bin/env python3
"""The default job's text (docs/data.md, "The default job's data"): the
English fortunes of Debian's `fortunes` package, one document per fortune,
and a byte-level BPE tokenizer trained on them with Hugging Face
`tokenizers`, set up as Llama 3's (its split regex, ByteLevel without a
prefix space, <|begin_of_text|>, <|end_of_text|> and reserved special
tokens; Llama 3's own tokenizer is gated).

  default_data.py FORTUNES_DIR OUT_DIR VOCAB_SIZE

Writes OUT_DIR/train.jsonl and OUT_DIR/eval.jsonl (every 20th fortune is
held out) and OUT_DIR/tokenizer.json (trained on the train split only).
Deterministic: the files are read in name order; the same package gives
the same bytes.
"""
import json, os, sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
SKIP = {"ascii-art"}  # pictures, not text


def train_bpe(texts, vocab):
    """A byte-level BPE of vocab tokens trained on texts (an iterable of
    strings), set up as Llama 3's (also tests/text/train_bpe.py's)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] + ["<|reserved_special_token_%d|>" % i for i in range(8)]
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def fortunes(root):
    for name in sorted(os.listdir(root)):
        p = os.path.join(root, name)
        if name in SKIP or "." in name or not os.path.isfile(p) or os.path.islink(p):
            continue
        with open(p, encoding="utf-8", errors="strict") as f:
            text = f.read()
        for doc in text.split("\n%\n"):
            doc = doc.strip("\n%")
            if doc.strip():
                yield name, doc


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    root, out, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
    docs = list(fortunes(root))
    if len(docs) < 1000:
        sys.exit(f"default_data: only {len(docs)} fortunes under {root}: is Debian's fortunes package installed?")
    os.makedirs(out, exist_ok=True)
    train, held = [], []
    for i, (_, d) in enumerate(docs):
        (held if i % 20 == 19 else train).append(d)
    for name, part in (("train", train), ("eval", held)):
        tmp = os.path.join(out, name + ".jsonl.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for d in part:
                f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
        os.replace(tmp, os.path.join(out, name + ".jsonl"))
    tok = train_bpe(train, vocab)
    tmp = os.path.join(out, "tokenizer.json.tmp")
    tok.save(tmp)
    os.replace(tmp, os.path.join(out, "tokenizer.json"))
    print(f"default_data: {len(train)} training and {len(held)} held-out fortunes "
          f"({sum(map(len, train)) / 1e6:.2f} + {sum(map(len, held)) / 1e6:.2f} MB) from {root}; "
          f"a {tok.get_vocab_size()}-token BPE in {out}/tokenizer.json")


if __name__ == "__main__":
    main()
