#!/usr/bin/env python3
"""Varied UTF-8 text for tokenizer parity tests, gathered offline and made
deterministically (same arguments, same bytes).

  make_corpus.py --mb 0.3 --seed 1 --jsonl OUT.jsonl [--text OUT.txt --text-mb 0.5]

JSON lines ({"text": ...} per document): Debian documentation and sources
found on this machine (copyright files, changelogs, READMEs, licences, C
headers, Python modules), mixed with generated documents: accented and
combining Latin, CJK, Hangul, emoji (ZWJ sequences, skin tones, flags),
other scripts, code, whitespace runs (tabs, CRLF, NBSP, U+3000, U+180E,
U+2028), long digit runs, contractions in any case, control characters,
random assigned code points, and special tokens inside the text
(<|begin_of_text|>, <|end_of_text|>, cut-off ones). --text writes one long
document (a text file) of the same mix, with long runs that have no piece
boundary, for the chunked encoding of big files.
Standard library only.
"""
import argparse, glob, gzip, json, os, random

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|reserved_special_token_5|>",
            "<|begin_of", "<|", "|>", "<|end_of_text|", "<s>", "</s>", "<|endoftext|>"]
WS = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "   \n", "\u00a0", "\u3000", "\u180e", "\u2028", "\u0085", " \t ", "\x0b", "\x0c"]
WORDS = "the of and to in is was that for it with as his on be at by had are but from or have an they which one you were all we her she there would their will when who him been has more if no out so said what up its about into than them can only other time new some could these two may first then do any like my now over such our man me even most made after also did many before must through back years where much your way well down should because each just those people".split()
ACCENT = "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿłśźżčďěňřšťůžőűğışşţăâîșțßẞÆØÅ"
COMBINING = ["\u0301", "\u0300", "\u0308", "\u0327", "\u030c", "\u0323"]
SCRIPTS = [(0x4e00, 0x9fff), (0x3040, 0x309f), (0x30a0, 0x30ff), (0xac00, 0xd7a3), (0x0600, 0x06ff), (0x05d0, 0x05ea),
           (0x0410, 0x044f), (0x0391, 0x03c9), (0x0900, 0x097f), (0x0e00, 0x0e7f), (0x10a0, 0x10ff), (0x1200, 0x137f)]
EMOJI = ["😀", "👍", "👍🏽", "🇫🇷", "🇯🇵", "👨‍👩‍👧‍👦", "❤️", "🏳️‍🌈", "🤖", "✨", "🙏🏿", "🧑‍💻", "©", "™", "⚙️"]
CODE = ['for (int i = 0; i < n; i++) {\n\tx[i] += y[i] * 2;\n}\n', 'def f(x):\n    return {"a": [1, 2, 3], \'b\': x ** 2}\n',
        '#include <stdio.h>\nint main(void) { printf("%d\\n", 42); return 0; }\n', 'SELECT id, name FROM users WHERE id > 10;\n',
        'if [ -n "$X" ]; then echo "${X}" | sed -e \'s/a/b/g\'; fi\n', 'let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n',
        '<div class="x">&amp; &lt;tag&gt;</div>\n', 'https://example.org/path?q=1&r=%20x#frag\n', '    \t  # comment\r\n']


def gather(rng):
    """Text files of this machine: Debian docs, licences, headers, Python sources."""
    pats = ["/usr/share/doc/*/copyright", "/usr/share/doc/*/README*", "/usr/share/doc/*/changelog*.gz",
            "/usr/share/doc/*/*.md", "/usr/share/common-licenses/*", "/usr/include/*.h", "/usr/include/*/*.h",
            "/usr/lib/python3/dist-packages/*/*.py", "/usr/lib/python3.11/*.py"]
    files = sorted(set(p for pat in pats for p in glob.glob(pat)))
    rng.shuffle(files)
    for p in files:
        try:
            if os.path.getsize(p) > 400_000:
                continue
            raw = gzip.open(p).read() if p.endswith(".gz") else open(p, "rb").read()
            yield raw.decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError):
            continue


def word(rng):
    w = rng.choice(WORDS)
    r = rng.random()
    if r < 0.1:
        w = w.upper()
    elif r < 0.2:
        w = w.capitalize()
    elif r < 0.3:
        w = "".join(rng.choice(ACCENT) if rng.random() < 0.3 else c for c in w)
    elif r < 0.35:
        w = w + rng.choice(COMBINING)
    return w


def generated(rng, size):
    out = []
    n = 0
    while n < size:
        k = rng.random()
        if k < 0.35:
            s = " ".join(word(rng) for _ in range(rng.randint(1, 12))) + rng.choice([".", ",", "!", "?", ";", ":", "", "..."])
        elif k < 0.45:
            a, b = rng.choice(SCRIPTS)
            s = "".join(chr(rng.randint(a, b)) for _ in range(rng.randint(1, 30)))
        elif k < 0.52:
            s = "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 5)))
        elif k < 0.6:
            s = rng.choice(CODE)
        elif k < 0.68:
            s = "".join(rng.choice(WS) for _ in range(rng.randint(1, 8)))
        elif k < 0.73:
            s = "".join(str(rng.randint(0, 9)) for _ in range(rng.randint(1, 40)))
        elif k < 0.8:
            s = rng.choice(SPECIALS)
        elif k < 0.86:
            s = rng.choice(["I'm", "you're", "WE'LL", "It'S", "they've", "she'd", "'ſ", "'s", "don't", "O'Neil", "'M", "''"])
        elif k < 0.9:
            s = "".join(chr(rng.randint(0, 31)) for _ in range(rng.randint(1, 3)))
        else:  # random assigned-looking code points, no surrogates
            s = ""
            while len(s) < rng.randint(1, 6):
                cp = rng.choice([rng.randint(0x20, 0x2fff), rng.randint(0x3000, 0xd7ff), rng.randint(0xe000, 0xfffd),
                                 rng.randint(0x10000, 0x1faff), rng.randint(0x20000, 0x2a6df)])
                s += chr(cp)
        out.append(s)
        out.append(rng.choice(["", " ", " ", "\n", ""]))
        n += len(s.encode())
    return "".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jsonl", required=True)
    ap.add_argument("--text")
    ap.add_argument("--text-mb", type=float, default=0.5)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    target = int(a.mb * 1e6)
    docs, n = [], 0
    src = gather(rng)
    while n < target:
        if rng.random() < 0.5:
            d = next(src, None) or generated(rng, 2000)
            if len(d.encode()) > 15_000:  # keep documents small enough to mix well
                d = d[:rng.randint(200, 15_000)]
            if rng.random() < 0.3:  # sprinkle generated text into real documents
                cut = rng.randint(0, len(d))
                d = d[:cut] + generated(rng, rng.randint(10, 400)) + d[cut:]
        else:
            d = generated(rng, rng.choice([0, 10, 100, 500, 2000, 8000]))
        docs.append(d)
        n += len(d.encode())
    docs += ["", " ", "\n", "<|begin_of_text|>", "a" * 5000, " " * 3000 + "x", "\u4e00" * 4000]
    with open(a.jsonl, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d, "id": len(d)}, ensure_ascii=rng.random() < 0.5) + "\n")
    if a.text:
        parts, n = [], 0
        while n < int(a.text_mb * 1e6):
            k = rng.random()
            if k < 0.05:  # long stretches without a place where a piece can end
                s = rng.choice(["\u4e00\u4e8c\u4e09", "xyzzy", "  "]) * rng.randint(20_000, 120_000)
            else:
                s = next(src, None) or generated(rng, 5000)
            parts.append(s)
            n += len(s.encode())
        with open(a.text, "w", encoding="utf-8", newline="") as f:
            f.write("".join(parts))


if __name__ == "__main__":
    main()
