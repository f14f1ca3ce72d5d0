"""Tokenizer fixtures: small tokenizer.json files of every style weft reads, with the ids and
texts the `tokenizers` library gives for them, committed under tests/data/tokenizers/NAME/
(tokenizer.json + expected.json) for tests/test_apps_tokenizer.cpp to compare against.

Run it through scripts/tokenizer_fixtures.sh, which makes a venv (tokenizers, sentencepiece,
protobuf, transformers; no torch). Styles, each trained on Debian's fortunes texts:
  gpt2       byte-level BPE, GPT-2's ByteLevel regex.
  llama3     byte-level BPE, Llama 3's Split regex then ByteLevel, ignore_merges, and the
             template <|begin_of_text|> $A of the Llama 3 post-processor.
  llama3_prefix  the llama3 fixture's tokenizer.json with ByteLevel's add_prefix_space true (not
             retrained): after a Split, `tokenizers` puts the space before each of its pieces.
  qwen2      byte-level BPE with Qwen2's NFC normalizer and Split regex; an added token with
             rstrip and one with lstrip.
  llama2     SentencePiece BPE (byte_fallback) in the form Llama 2, Mistral v0.1 and TinyLlama
             publish: normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, decoder
             Replace + ByteFallback + Fuse + Strip, template <s> $A; added tokens with lstrip,
             rstrip and normalized.
  metaspace  the same model as transformers 5 converts it (Metaspace pre-tokenizer, prepend
             scheme "first"), here with split words and a Metaspace decoder.
  mistral    Mistral 7B's own tokenizer.model (--mistral PATH, 32,000 tokens), converted by
             transformers as llama2 is; its ids are also checked against `sentencepiece`.
expected.json: for each text, ids without and with the special tokens, decode with and without
skip_special_tokens; and id lists (byte tokens that do not form UTF-8, specials) decoded.
"""
import argparse
import json
import os
import random
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "don't I'll we've they're she'd HE'S O'NEIL'S it's",
    "digits 0 7 42 1234567 3.14159 1,000,000 2026-11-26 x86_64",
    "   leading spaces, two  inner,   three,\ttab\t\tand trailing   ",
    "lines\n\nblank line above\r\nCRLF line\n   \n  indented\n",
    "Unicode: caf\u00e9 na\u00efve \u00fcber \u00c5ngstr\u00f6m, \u4e2d\u6587\u5b57, \u0440\u0443\u0441\u0441\u043a\u0438\u0439, "
    "\u03b1\u03b2\u03b3, emoji \U0001f642\U0001f680, \u2014 dashes \u2013, \u00bd \u2153 \u0660\u0661\u0662",
    "<|endoftext|>special tokens<|user|> between words <|endoftext|><|endoftext|> and <|user",
    "",
    " ",
    "\n",
    "symbols: @#$%^&*()[]{}<>~`|\\/;:'\"?!.,-_=+",
]
# Added for the styles beyond GPT-2 and Llama 3's first fixtures (their cases stay as they were).
MORE_TEXTS = [
    "a" + " " * 40 + "b" + "\t" * 9 + "c\n\n\n\n    \n" + " " * 17,
    "composed caf\u00e9 and decomposed cafe\u0301, \u212b \u00c5 A\u030a, \ufb01 \u2460 \uff21\uff22",
    "CJK \u6f22\u5b57\u304b\u306a\u30ab\u30ca\ud55c\uad6d\uc5b4 \u9f98\u9f49 and emoji \U0001f468\u200d\U0001f469\u200d\U0001f467 "
    "\U0001f44d\U0001f3fd \U0001f1e9\U0001f1ea \u2764\ufe0f",
    "numbers 3.14159265358979 0x1F 1e-9 \u0663\u0664 \u2167 100,000,000",
    "<s>Hello</s> <s> spaced </s>\n<unk> x",
    "<|begin_of_text|>a<|im_start|>user\nhi<|im_end|>\n<|im_end|>   after  <mask> and   <mask>x",
    "[END]  then qzx and qzxqzx, <mask>",
]
# For llama3_prefix: pieces of the Split that start with a space, and ones that do not (words,
# punctuation, digits, new lines) at the text's start and after added tokens.
PREFIX_TEXTS = [
    "Hello,world 12",
    "\nfoo",
    "a1b22c333d4444 e",
    "x<|user|>y <|user|> z<|endoftext|>\n\n  q",
]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def fortune_files():
    root = "/usr/share/games/fortunes"
    files = [os.path.join(root, f) for f in sorted(os.listdir(root)) if "." not in f
             and os.path.isfile(os.path.join(root, f)) and not os.path.islink(os.path.join(root, f))]
    if not files:
        sys.exit("tokenizer_fixtures.py: no texts in /usr/share/games/fortunes (apt-get install fortunes)")
    return files


def paragraphs():
    with open(fortune_files()[0], encoding="utf-8", errors="replace") as f:
        return [p.strip("\n") for p in f.read().split("\n%\n")[:6]]


def train_byte_level(name, specials, split, normalizer=None, ignore_merges=False):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(fortune_files(), trainer)
    return tok


def train_sentencepiece(work):
    import sentencepiece as spm
    prefix = os.path.join(work, "sp")
    spm.SentencePieceTrainer.train(
        input=fortune_files()[:20], model_prefix=prefix, vocab_size=1000, model_type="bpe", byte_fallback=True,
        character_coverage=0.9995, input_sentence_size=200000, shuffle_input_sentence=False, num_threads=1,
        normalization_rule_name="identity", remove_extra_whitespaces=False, minloglevel=2)  # as Llama's
    return prefix + ".model"


def convert_spm(model_file, work, legacy):
    """The tokenizer transformers makes from a tokenizer.model (LlamaTokenizer), as a Tokenizer."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    d = tempfile.mkdtemp(dir=work)
    shutil.copy(model_file, os.path.join(d, "tokenizer.model"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizer", "legacy": legacy, "add_bos_token": True,
                   "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, f)
    t = AutoTokenizer.from_pretrained(d)
    t.save_pretrained(os.path.join(d, "out"))
    return Tokenizer.from_file(os.path.join(d, "out", "tokenizer.json"))


def published_form(tok):
    """Llama 2 / Mistral v0.1 / TinyLlama's tokenizer.json: Prepend + Replace, no pre-tokenizer."""
    from tokenizers import Tokenizer, normalizers
    j = json.loads(tok.to_str())
    j["model"]["unk_token"] = "<unk>"
    t = Tokenizer.from_str(json.dumps(j))
    t.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    t.pre_tokenizer = None
    return t


def byte_tokens(tok):
    return [i for t, i in tok.get_vocab().items() if len(t) == 6 and t.startswith("<0x") and t.endswith(">")]


def decode_cases(tok, seed):
    """Id lists to decode: random ones, byte tokens that do not form UTF-8, specials amid text."""
    rng = random.Random(seed)
    vocab = tok.get_vocab_size()
    specials = [i for i, t in tok.get_added_tokens_decoder().items() if t.special]
    lists = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 13))] for _ in range(12)]
    lists += [specials + [rng.randrange(vocab) for _ in range(5)] + specials[:1]]
    bytes_ = sorted(byte_tokens(tok))
    if bytes_:
        by = {tok.id_to_token(i): i for i in bytes_}
        lists += [[by["<0xE4>"], by["<0xB8>"]], [by["<0xE4>"], by["<0xB8>"], by["<0xAD>"], by["<0xFF>"]],
                  [rng.randrange(vocab), by["<0xF0>"], rng.randrange(vocab), by["<0x9F>"], by["<0x99>"]]]
    return [{"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
             "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)} for ids in lists]


def write(tok, out, texts, extra=None):
    import tokenizers
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    cases = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        cases.append({"text": t, "ids": ids, "ids_special": tok.encode(t, add_special_tokens=True).ids,
                      "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    want = {"made_by": "scripts/tokenizer_fixtures.py", "tokenizers": tokenizers.__version__,
            "vocab_size": tok.get_vocab_size(), "cases": cases, "decode_cases": decode_cases(tok, len(texts))}
    want.update(extra or {})
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(want, f, ensure_ascii=False, indent=1)
    log(f"{out}: vocabulary {tok.get_vocab_size()}, {len(cases)} texts, {len(want['decode_cases'])} id lists")


def sentencepiece_agreement(model_file, tok, texts):
    """How many texts `sentencepiece` encodes as the converted tokenizer does (its BOS aside)."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=model_file)
    plain = [t for t in texts if "<" not in t and t.strip()]
    differ = [t for t in plain if sp.encode(t) != tok.encode(t, add_special_tokens=False).ids]
    same = len(plain) - len(differ)
    log(f"sentencepiece agrees on {same} of {len(plain)} texts; not on {[t[:30] for t in differ]}")
    return {"sentencepiece_agrees": f"{same} of {len(plain)}"}


def add_stripped(tok, lstrip_token, rstrip_token, normalized_token=None):
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(lstrip_token, lstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken(rstrip_token, rstrip=True, normalized=False, special=False)])
    if normalized_token:
        tok.add_tokens([AddedToken(normalized_token, normalized=True, special=False)])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data", "tokenizers"))
    ap.add_argument("--mistral", default=None, help="Mistral 7B's tokenizer.model (the mistral fixture)")
    ap.add_argument("--only", nargs="+", default=None,
                    choices=["gpt2", "llama3", "llama3_prefix", "qwen2", "llama2", "metaspace", "mistral"])
    args = ap.parse_args()
    from tokenizers import decoders, normalizers, pre_tokenizers, processors
    want = set(args.only or ["gpt2", "llama3", "llama3_prefix", "qwen2", "llama2", "metaspace"] + (["mistral"] if args.mistral else []))
    texts, more = TEXTS + paragraphs(), TEXTS + paragraphs() + MORE_TEXTS
    work = tempfile.mkdtemp()
    if "gpt2" in want:
        write(train_byte_level("gpt2", ["<|endoftext|>", "<|user|>"], None), os.path.join(args.out, "gpt2"), texts)
    if "llama3" in want:
        tok = train_byte_level("llama3", ["<|endoftext|>", "<|user|>"], LLAMA3_SPLIT, ignore_merges=True)
        tok.add_special_tokens(["<|begin_of_text|>"])
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B:1",
                                          special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])])
        write(tok, os.path.join(args.out, "llama3"), texts)
    if "llama3_prefix" in want:  # from the llama3 fixture as written, so run after it
        from tokenizers import Tokenizer
        with open(os.path.join(args.out, "llama3", "tokenizer.json"), encoding="utf-8") as f:
            j = json.load(f)
        j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True
        write(Tokenizer.from_str(json.dumps(j)), os.path.join(args.out, "llama3_prefix"), texts + PREFIX_TEXTS)
    if "qwen2" in want:
        tok = train_byte_level("qwen2", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], QWEN2_SPLIT,
                               normalizer=normalizers.NFC())
        add_stripped(tok, "<mask>", "[END]")
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        write(tok, os.path.join(args.out, "qwen2"), more)
    if want & {"llama2", "metaspace"}:
        model = train_sentencepiece(work)
        if "llama2" in want:
            tok = published_form(convert_spm(model, work, legacy=True))
            add_stripped(tok, "<mask>", "[END]", "qzx")
            write(tok, os.path.join(args.out, "llama2"), more, sentencepiece_agreement(model, tok, more))
        if "metaspace" in want:
            tok = convert_spm(model, work, legacy=False)
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
            tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="\u2581", prepend_scheme="first"),
                                             decoders.ByteFallback(), decoders.Fuse()])
            write(tok, os.path.join(args.out, "metaspace"), more, sentencepiece_agreement(model, tok, more))
    if "mistral" in want:
        tok = published_form(convert_spm(args.mistral, work, legacy=True))
        write(tok, os.path.join(args.out, "mistral"), more, sentencepiece_agreement(args.mistral, tok, more))
    shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
