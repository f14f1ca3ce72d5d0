#!/usr/bin/env python3
"""Fine-tuning data reference for weft's `prepare` of JSONL records (apps/transformer/example_data.h).

Run it through scripts/hf_reference.sh (chat-fixture), which makes the venv. A developer tool:
never part of meson test or CI (tests/test_apps_examples.cpp reads the committed fixture).

  fixture [--out tests/data/chat]
      records.jsonl: five records of each kind ({"text"}, {"prompt", "completion"},
      {"messages"}). Three tokenizer directories, each a tokenizer.json of tests/data/tokenizers
      and a tokenizer_config.json holding its family's chat template (with {% generation %}
      marks around what the assistant says, which change no text):
        llama3   the llama3 tokenizer plus <|start_header_id|>, <|end_header_id|>, <|eot_id|>;
                 Llama 3's template
        chatml   the qwen2 tokenizer; Qwen2.5's template without tools (a default system message)
        mistral  the llama2 (SentencePiece-style) tokenizer; Mistral v0.1's [INST] template
      model/: a random tied Llama (vocabulary 2,100) saved by transformers.
      expected.json, per tokenizer: each record's ids and labels (-100 where no loss), or the
      error weft must give; and the loss transformers' LlamaForCausalLM computes with those
      labels over all accepted records in one right-padded batch.
      Labels, as weft makes them: a text record is BOS? text EOS, all trained; a prompt/completion
      record BOS? prompt completion EOS with completion and EOS trained (the completion starts at
      the first token where the prompt's own encoding stops agreeing with the whole's); a chat is
      apply_chat_template's text, trained where transformers' assistant mask says.
"""
import argparse
import json
import os
import shutil

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZERS = os.path.join(ROOT, "tests", "data", "tokenizers")
VOCAB = 2100

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
          "{% set header = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' %}"
          "{% if loop.index0 == 0 %}{% set header = bos_token + header %}{% endif %}{{ header }}"
          "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}"
          "{% endgeneration %}{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
CHATML = ("{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
          "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
          "helpful assistant.<|im_end|>\\n' }}{%- endif %}"
          "{%- for message in messages %}{%- if message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
          "{% generation %}{{- message.content + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
          "{%- elif message.role == 'user' or (message.role == 'system' and not loop.first) %}"
          "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
           "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{% generation %}{{ message['content'] + eos_token}}"
           "{% endgeneration %}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
           "{% endif %}{% endfor %}")
STYLES = {  # name: (tokenizer fixture, template, bos, eos, added special tokens)
    "llama3": ("llama3", LLAMA3, "<|begin_of_text|>", "<|eot_id|>",
               ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]),
    "chatml": ("qwen2", CHATML, None, "<|im_end|>", []),
    "mistral": ("llama2", MISTRAL, "<s>", "</s>", []),
}
EOS = {"llama3": "<|endoftext|>", "chatml": "<|endoftext|>", "mistral": "</s>"}  # prepare --eos

RECORDS = [
    {"text": "The quick brown fox jumps over the lazy dog."},
    {"text": "  leading spaces, caf\u00e9 na\u00efve, digits 1234567 and\nnew lines\n\n"},
    {"text": "A"},
    {"text": "Unicode \u4e2d\u6587 \u0440\u0443\u0441\u0441\u043a\u0438\u0439 emoji \U0001f642 done."},
    {"text": "symbols: @#$%^&*()[]{}<>~`|\\/;:'\"?!.,-_=+"},
    {"prompt": "Q: what is two plus two?\nA:", "completion": " four"},
    {"prompt": "Translate to French: cat", "completion": " chat"},
    {"prompt": "Write a haiku about rain.\n", "completion": "Soft rain on the roof\nwhispers to the sleeping town\nthe"
                                                         " gutters reply"},
    {"prompt": "", "completion": "only a completion"},
    {"prompt": "Numbers: 1, 2, 3,", "completion": " 4, 5"},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello! How can I help?"}]},
    {"messages": [{"role": "user", "content": "name a colour"}, {"role": "assistant", "content": "blue"},
                  {"role": "user", "content": "another one"}, {"role": "assistant", "content": "red"}]},
    {"messages": [{"role": "user", "content": "  padded question?  "},
                  {"role": "assistant", "content": "\n  an answer with spaces around it \n"}]},
    {"messages": [{"role": "user", "content": "caf\u00e9 \u4e2d\u6587?"}, {"role": "assistant",
                                                                           "content": "\U0001f642 s\u00ed"}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "why is the sky blue"},
                  {"role": "assistant", "content": "Rayleigh scattering."}]},
]


def tokenizer_dir(out, style):
    from transformers import AutoTokenizer
    src, template, bos, eos, added = STYLES[style]
    d = os.path.join(out, style)
    os.makedirs(d, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(os.path.join(TOKENIZERS, src))
    if added:
        tok.add_special_tokens({"additional_special_tokens": added})
    tok.chat_template = template
    tok.bos_token, tok.eos_token = bos, eos
    tok.save_pretrained(d)
    for extra in os.listdir(d):  # tokenizer.json and tokenizer_config.json hold all of it
        if extra not in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            os.remove(os.path.join(d, extra))
    if os.path.exists(os.path.join(d, "chat_template.jinja")):  # keep the template in tokenizer_config.json
        os.remove(os.path.join(d, "chat_template.jinja"))
        with open(os.path.join(d, "tokenizer_config.json")) as f:
            config = json.load(f)
        config["chat_template"] = template
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(config, f, indent=2, ensure_ascii=False)
    return AutoTokenizer.from_pretrained(d)


def common_prefix(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def encode_record(tok, record, eos):
    if "messages" in record:
        out = tok.apply_chat_template(record["messages"], tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        ids = list(out["input_ids"])
        return ids, list(out["assistant_masks"])
    whole = tok.encode(record.get("text", record.get("prompt", "") + record.get("completion", "")),
                       add_special_tokens=False)
    trained = [1] * len(whole)
    if "prompt" in record:
        start = common_prefix(tok.encode(record["prompt"], add_special_tokens=False), whole)
        trained = [0] * start + [1] * (len(whole) - start)
    specials = tok("x", add_special_tokens=True)["input_ids"]
    bare = tok("x", add_special_tokens=False)["input_ids"]
    k = next(i for i in range(len(specials)) if specials[i:i + len(bare)] == bare)
    prefix, suffix = specials[:k], specials[k + len(bare):]
    ids = prefix + whole + suffix + [tok.convert_tokens_to_ids(eos)]
    return ids, [0] * len(prefix) + trained + [1] * (len(suffix) + 1)


def cmd_fixture(args):
    from transformers import LlamaConfig, LlamaForCausalLM
    out = args.out
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "records.jsonl"), "w") as f:
        for r in RECORDS:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, initializer_range=0.2, rms_norm_eps=1e-5, rope_theta=10000.0)
    model = LlamaForCausalLM(cfg).float().eval()
    model.save_pretrained(os.path.join(out, "model"))
    expected = {}
    for style in STYLES:
        tok = tokenizer_dir(out, style)
        rows = []
        for r in RECORDS:
            try:
                ids, mask = encode_record(tok, r, EOS[style])
            except Exception as e:  # the template refuses it
                rows.append({"error": str(e)})
                continue
            labels = [i if m else -100 for i, m in zip(ids, mask)]
            labels[0] = -100  # never a target
            assert max(ids) < VOCAB, (style, max(ids))
            rows.append({"ids": ids, "labels": labels})
        kept = [x for x in rows if "ids" in x]
        T = max(len(x["ids"]) for x in kept)
        ids = torch.tensor([x["ids"] + [0] * (T - len(x["ids"])) for x in kept])
        labels = torch.tensor([x["labels"] + [-100] * (T - len(x["labels"])) for x in kept])
        with torch.no_grad():
            loss = model(input_ids=ids, labels=labels).loss.item()
        expected[style] = {"records": rows, "loss": loss, "eos": EOS[style]}
        print(f"{style}: {len(kept)} records, {int((labels != -100).sum())} trained targets, loss {loss:.6f}")
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    fx = sub.add_parser("fixture")
    fx.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "chat"))
    args = ap.parse_args()
    if args.cmd == "fixture":
        shutil.rmtree(args.out, ignore_errors=True)
        cmd_fixture(args)


if __name__ == "__main__":
    main()
