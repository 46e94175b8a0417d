#!/usr/bin/env python3
"""A small byte-level BPE tokenizer.json with Llama 3's pre-tokenizer and
special tokens, for the tests of `slicetrain tokenize` that need no PyPI
package: the 256 byte tokens, merges of common English pairs, then
<|begin_of_text|> and <|end_of_text|> (vocabulary < 65536: uint16 token
files).

  tiny_tokenizer.py OUT.json [--no-specials] [--broken KIND]

--no-specials leaves the added tokens out (no BOS/EOS to find);
--broken no-model|bad-merge|not-json writes a malformed file. Standard library only.
"""
import json, sys

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
MERGES = [("t", "h"), ("th", "e"), ("Ġ", "t"), ("Ġ", "the"), ("i", "n"), ("a", "n"), ("e", "r"), ("o", "n"),
          ("Ġ", "a"), ("r", "e"), ("a", "t"), ("e", "n"), ("Ġ", "s"), ("o", "r"), ("Ġ", "w"), ("i", "s"),
          ("Ġa", "n"), ("Ġan", "d"), ("in", "g"), ("Ġ", "o"), ("Ġo", "f"), ("e", "d")]


def byte_chars():
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def main():
    out = sys.argv[1]
    flags = sys.argv[2:]
    vocab = {c: i for i, c in enumerate(byte_chars())}
    for a, b in MERGES:
        assert a in vocab and b in vocab, (a, b)
        vocab.setdefault(a + b, len(vocab))
    added = []
    if "--no-specials" not in flags:
        for i, s in enumerate(["<|begin_of_text|>", "<|end_of_text|>"]):
            added.append({"id": len(vocab) + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True})
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
               {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated", "invert": False},
               {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
           "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                               "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": [a + " " + b for a, b in MERGES]}}
    if "--broken" in flags:
        kind = flags[flags.index("--broken") + 1]
        if kind == "no-model":
            del tok["model"]
        elif kind == "bad-merge":
            tok["model"]["merges"].append("q z")
        elif kind == "not-json":
            open(out, "w").write(json.dumps(tok)[:500])
            return
    with open(out, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
