#!/usr/bin/env python3
"""GPT-2's tokenizer.json with the `tokenizers` library: the test fixture and the reference side of
the `prepare` benchmark.

Run it through scripts/gpt2_tokenizer.sh, which makes the venv (`pip install tokenizers`). A
developer tool: never part of meson test or CI (the tests only read the committed fixture).

  fixture [--tokenizer tests/data/gpt2/tokenizer.json] [--from-gpt2 ENCODER_JSON VOCAB_BPE]
      Writes expected.json beside the tokenizer: for each test text (Unicode, whitespace runs,
      digits, contractions, control characters, <|endoftext|> alone, adjacent and cut short, and
      a long seeded random mix of all of these) the ids of encode(text, add_special_tokens=False)
      and decode(ids) with and without skip_special_tokens; and for byte strings that are not
      UTF-8, the offset of the first bad byte (where Python's UTF-8 decoder stops, as weft's
      encode does), the text Python reads with errors="replace" and its ids, and the byte-level
      ids of the raw bytes with decode() of them. With --from-gpt2 it first writes the
      tokenizer.json from GPT-2's released encoder.json and vocab.bpe (their sha256 checked) as
      published GPT-2-family tokenizer.json files are made: ByteLevelBPETokenizer(encoder,
      merges), <|endoftext|> added as a special token, save().

  bench [--tokenizer T] [--data /usr/share/games/fortunes] [--compare DIR] [--rounds 3]
      Encodes the files `weft-transformer prepare` reads (regular files in name order, no *.dat,
      no links), one encode() per file on one thread as prepare does, each followed by
      <|endoftext|>, and prints the load time, MB/s (best of --rounds) and the token count. With
      --compare DIR (a dataset `prepare` made of the same files, its default --eos) it checks
      that DIR/train.tokens then DIR/val.tokens hold exactly these ids. Peak memory: run it
      under /usr/bin/time -v (without --compare); one thread: RAYON_NUM_THREADS=1. --batch
      encodes all files in one encode_batch() call instead (the library's threads).
"""
import argparse
import hashlib
import json
import os
import random
import sys
import time

try:
    import tokenizers
    from tokenizers import ByteLevelBPETokenizer, Tokenizer
except ImportError as e:  # pragma: no cover
    sys.exit(f"gpt2_tokenizer.py: {e}; run it through scripts/gpt2_tokenizer.sh (pip install tokenizers)")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TOKENIZER = os.path.join(REPO, "tests", "data", "gpt2", "tokenizer.json")
EOT = "<|endoftext|>"
# The digests tiktoken checks for GPT-2's released files.
GPT2_SHA256 = {"encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
               "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"}

TEXTS = [
    ("readme", "Hello world, it's 2026!"),
    ("empty", ""),
    ("endoftext", EOT),
    ("endoftext twice", EOT + EOT),
    ("endoftext inside words", f"a{EOT}b {EOT} c{EOT}\n{EOT}  "),
    ("endoftext cut short", "<|endoftext| <|endoftext <endoftext|> <|ENDOFTEXT|> <|endof" + EOT + "text|>"),
    ("whitespace runs", "a  b   c    d\t\te\n\nf\n\n\n g \t \n h    \r\n\r\n  i   \n   "),
    ("only whitespace", "   \t\t\n\n \n\r\n     "),
    ("unicode whitespace", "x\u00a0y\u2009z\u3000w\u2028v\u0085u\u200bt\u180es\ufeffr \u00a0 \u3000\u3000q"),
    ("digits", "0 1 12 123 1234 12345 1234567890 3.14159 1,000,000 0x1F 2026-11-28 10:45 -42 +7 1e-5 ½ ² ٣ ३"),
    ("contractions", "don't I'LL we've you're she'd it's 'tis rock'n'roll they'D o'clock ''' 's"),
    ("unicode", "café naïve Straße Ωμέγα Привет мир 日本語のテキスト 한국어 العربية עברית हिन्दी ไทย "
                "e\u0301 \U0001d518\U0001d52b\U0001d526 👩\u200d💻 🇩🇪 🙂🙂 \U0010fffd \ufffd"),
    ("control characters", "tab\tvt\x0bff\x0cnul\x00esc\x1b[0m del\x7f c1\x85\x9f"),
    ("code", "def f(x):\n    return x**2  # square\n\nif __name__ == \"__main__\":\n\tprint(f(3))\n"),
    ("prose", "It was the best of times, it was the worst of times; it was the age of wisdom...\n"
              "  -- Charles Dickens, \"A Tale of Two Cities\" (1859)\n\n"
              "Q: What's 6 x 7?\nA: 42.    (Obviously.)\n"),
]

# Fragments of the seeded random text: everything above, mixed at random.
FRAGMENTS = (["the", "The", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "tokenizer",
              "café", "Straße", "naïve", "日本", "語", "한국어", "Привет", "ελληνικά", "🙂", "👩\u200d💻",
              "e\u0301", "don't", "I'm", "we'll", "'s", "'LL", "0", "7", "42", "2026", "1234567",
              "3.14", "1,000", ",", ".", "!", "?", ";", ":", "...", "--", "-", "(", ")", "\"", "'",
              "#", "$", "%", "&", "*", "@", "[", "]", "{", "}", "<", ">", "|", "/", "\\", "_",
              EOT, "<|endoftext|", "<|"]
             + [" "] * 30 + ["  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\u00a0", "\u3000"])


def log(msg=""):
    print(msg, flush=True)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def random_text(seed, n):
    rng = random.Random(seed)
    return "".join(rng.choice(FRAGMENTS) for _ in range(n))


def invalid_utf8_cases(mixed):
    """Byte strings that are not UTF-8, one kind of fault each, and the mixed text with them."""
    cut = len(mixed.encode()) // 2
    raw = mixed.encode()
    while raw[cut] & 0xC0 == 0x80:   # a character boundary
        cut += 1
    return [
        ("lone continuation byte", b"abc \x80 def"),
        ("byte 0xff", b"caf\xc3\xa9 \xff" + EOT.encode() + b"12"),
        ("byte 0xfe 0xff pair", b"\xfe\xff  x"),
        ("truncated at the end", b"end \xe2\x82"),
        ("truncated inside", b"\xe6\x97 \xe6\x97\xa5 ok"),
        ("overlong slash", b"\xc0\xaf slash"),
        ("surrogate", b"x\xed\xa0\x80y"),
        ("above U+10FFFF", b"top \xf4\x90\x80\x80 !"),
        ("in the mixed text", raw[:cut] + b"\xff\xc3 \x80\x80" + raw[cut:]),
    ]


def byte_ids(tok):
    """The id of each byte's one-character token (GPT-2's bytes_to_unicode)."""
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cps, n = {}, 0
    for b in range(256):
        if b in printable:
            cps[b] = b
        else:
            cps[b] = 256 + n
            n += 1
    ids = [tok.token_to_id(chr(cps[b])) for b in range(256)]
    if None in ids:
        raise RuntimeError("the vocabulary lacks a byte's token: not byte-level BPE")
    return ids


def make_tokenizer(encoder, merges, out):
    for path in (encoder, merges):
        want = GPT2_SHA256[os.path.basename(path)] if os.path.basename(path) in GPT2_SHA256 else None
        got = sha256(path)
        if want is None or got != want:
            sys.exit(f"gpt2_tokenizer.py: {path}: sha256 {got}; wanted GPT-2's encoder.json or vocab.bpe "
                     f"({GPT2_SHA256})")
    tok = ByteLevelBPETokenizer(encoder, merges)
    tok.add_special_tokens([EOT])
    tok.save(out)
    log(f"{out}: written from {encoder} and {merges} (sha256 {sha256(out)})")


def cmd_fixture(args):
    path = os.path.abspath(args.tokenizer)
    if args.from_gpt2:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        make_tokenizer(args.from_gpt2[0], args.from_gpt2[1], path)
    tok = Tokenizer.from_file(path)
    if tok.encode("Hello world, it's 2026!", add_special_tokens=False).ids != [15496, 995, 11, 340, 338, 1160, 2075, 0]:
        sys.exit(f"gpt2_tokenizer.py: {path} is not GPT-2's tokenizer (\"Hello world, it's 2026!\" encodes otherwise)")
    mixed = random_text(57, 6000)
    cases = []
    for name, text in TEXTS + [("random mix", mixed)]:
        ids = tok.encode(text, add_special_tokens=False).ids
        decoded = tok.decode(ids, skip_special_tokens=False)
        if decoded != text:
            raise RuntimeError(f"{name}: tokenizers does not decode its encoding back to the text")
        cases.append({"name": name, "text": text, "ids": ids, "decoded": decoded,
                      "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    by_byte = byte_ids(tok)
    invalid = []
    for name, raw in invalid_utf8_cases(mixed):
        try:
            raw.decode("utf-8")
            raise RuntimeError(f"{name}: the bytes are UTF-8")
        except UnicodeDecodeError as e:
            first_bad = e.start
        replaced = raw.decode("utf-8", errors="replace")
        ids = tok.encode(replaced, add_special_tokens=False).ids
        raw_ids = [by_byte[b] for b in raw]
        invalid.append({"name": name, "bytes_hex": raw.hex(), "first_bad_byte": first_bad,
                        "replaced": replaced, "ids": ids, "byte_ids": raw_ids,
                        "byte_ids_decoded": tok.decode(raw_ids, skip_special_tokens=False)})
    out = os.path.join(os.path.dirname(path), "expected.json")
    head = {"made_by": "scripts/gpt2_tokenizer.py fixture", "tokenizers": tokenizers.__version__,
            "tokenizer_sha256": sha256(path), "vocab_size": tok.get_vocab_size()}
    one = lambda v: json.dumps(v, ensure_ascii=False)   # noqa: E731 (a case per line)
    with open(out, "w", encoding="utf-8") as f:
        f.write("{\n" + "".join(f" {one(k)}: {one(v)},\n" for k, v in head.items()))
        f.write(' "cases": [\n  ' + ",\n  ".join(one(c) for c in cases) + "\n ],\n")
        f.write(' "invalid_utf8": [\n  ' + ",\n  ".join(one(c) for c in invalid) + "\n ]\n}\n")
    with open(out, encoding="utf-8") as f:
        json.load(f)   # reads back
    n = sum(len(c["ids"]) for c in cases)
    log(f"{out}: {len(cases)} texts ({n} ids), {len(invalid)} byte strings that are not UTF-8; "
        f"tokenizers {tokenizers.__version__}")
    return 0


def prepare_files(data):
    """The files weft-transformer prepare reads, in its order."""
    if not os.path.isdir(data):
        return [data]
    return sorted(os.path.join(data, n) for n in os.listdir(data)
                  if not os.path.islink(os.path.join(data, n)) and os.path.isfile(os.path.join(data, n))
                  and not n.endswith(".dat"))


def read_token_file(path):
    import array
    with open(path, "rb") as f:
        head = f.read(128)
        if head[:8] != b"WEFTTOK1":
            sys.exit(f"gpt2_tokenizer.py: {path} is not a weft token file")
        width = int.from_bytes(head[12:16], "little")
        a = array.array({2: "H", 4: "I"}[width])
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return a.tolist()


def cmd_bench(args):
    files = prepare_files(args.data)
    texts = []
    for p in files:
        with open(p, "rb") as f:
            texts.append(f.read().decode("utf-8"))   # prepare refuses what is not UTF-8, as this does
    nbytes = sum(len(t.encode()) for t in texts)
    t0 = time.perf_counter()
    tok = Tokenizer.from_file(args.tokenizer)
    load = time.perf_counter() - t0
    eot = tok.token_to_id(EOT)
    secs, ids = [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        ids = []
        encodings = (tok.encode_batch(texts, add_special_tokens=False) if args.batch
                     else (tok.encode(t, add_special_tokens=False) for t in texts))
        for e in encodings:
            ids.extend(e.ids)
            ids.append(eot)
        secs.append(time.perf_counter() - t0)
    best = min(secs)
    log(f"tokenizers {tokenizers.__version__}{' encode_batch' if args.batch else ''}: {len(files)} files, {nbytes / 1e6:.2f} MB, {len(ids)} tokens; "
        f"load {load:.3f} s; encode best {best:.3f} s = {nbytes / best / 1e6:.2f} MB/s "
        f"(rounds: {', '.join(f'{s:.3f}' for s in secs)} s)")
    if args.compare:
        weft = (read_token_file(os.path.join(args.compare, "train.tokens"))
                + read_token_file(os.path.join(args.compare, "val.tokens")))
        if weft != ids:
            i = next((k for k, (a, b) in enumerate(zip(weft, ids)) if a != b), min(len(weft), len(ids)))
            log(f"FAIL: {args.compare} differs from tokenizers at token {i} (weft {len(weft)} tokens, "
                f"tokenizers {len(ids)})")
            return 1
        log(f"{args.compare}: all {len(ids)} ids equal tokenizers'")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="see the module docstring of scripts/gpt2_tokenizer.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    fx = sub.add_parser("fixture", help="write expected.json beside the GPT-2 tokenizer.json")
    fx.add_argument("--tokenizer", default=DEFAULT_TOKENIZER)
    fx.add_argument("--from-gpt2", nargs=2, metavar=("ENCODER_JSON", "VOCAB_BPE"),
                    help="first write the tokenizer.json from GPT-2's released files")
    bn = sub.add_parser("bench", help="encode a text folder as prepare does; MB/s")
    bn.add_argument("--tokenizer", default=DEFAULT_TOKENIZER)
    bn.add_argument("--data", default="/usr/share/games/fortunes")
    bn.add_argument("--compare", help="a dataset directory of weft-transformer prepare to check id for id")
    bn.add_argument("--rounds", type=int, default=3)
    bn.add_argument("--batch", action="store_true",
                    help="one encode_batch() of all files (RAYON_NUM_THREADS threads) instead")
    args = ap.parse_args()
    return {"fixture": cmd_fixture, "bench": cmd_bench}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
