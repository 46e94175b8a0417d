#!/usr/bin/env python3
"""Trains a byte-level BPE tokenizer.json with Hugging Face `tokenizers`
(the test venv's), set up as Llama 3's: its split regex, ByteLevel without
prefix space, <|begin_of_text|>, <|end_of_text|> and reserved special
tokens; for the parity tests when no Llama 3 tokenizer is installed, and
for a vocabulary under 65536 (uint16 token files).

  train_bpe.py OUT.json VOCAB_SIZE INPUT.jsonl...
"""
import json, sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def texts(paths):
    for p in paths:
        with open(p, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)["text"]


def main():
    out, vocab, inputs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] + ["<|reserved_special_token_%d|>" % i for i in range(8)]
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts(inputs), trainer=trainer)
    tok.save(out)


if __name__ == "__main__":
    main()
