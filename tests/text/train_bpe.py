#!/usr/bin/env python3
"""Trains a byte-level BPE tokenizer.json with Hugging Face `tokenizers`
(the test venv's), set up as Llama 3's: its split regex, ByteLevel without
prefix space, <|begin_of_text|>, <|end_of_text|> and reserved special
tokens; for the parity tests when no Llama 3 tokenizer is installed, and
for a vocabulary under 65536 (uint16 token files).

  train_bpe.py OUT.json VOCAB_SIZE INPUT.jsonl...
"""
import json, os, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from default_data import train_bpe  # noqa: E402  (the one trainer, the default job's too)


def texts(paths):
    for p in paths:
        with open(p, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)["text"]


def main():
    out, vocab, inputs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    train_bpe(texts(inputs), vocab).save(out)


if __name__ == "__main__":
    main()
