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
      qwen3/: the qwen2 tokenizer plus Qwen3's <think>, </think>, <tool_response>, </tool_response>
      and Qwen3's published template (no generation marks; the labels come from a copy with them
      around each assistant message after its header, think block included, and its <|im_end|>).
      templates.json: for Qwen3, for chatml templates whose default system message is written
      with Jinja escapes and for one that writes {{ bos_token }} first, each record's ids and labels
      (weft renders them from the template alone).
  templates [--out tests/data/chat]
      only qwen3/ and templates.json (the fixture command writes them too).
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
QWEN3 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""
# Qwen3's template with {% generation %} around what an assistant message says after its header
# (the think block too) and its <|im_end|>: the same text, and transformers' assistant mask.
QWEN3_MARKED = QWEN3
for _old, _new in [
        ("""'\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}""",
         """'\\n' }}{% generation %}{{- '<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + """
         """content.lstrip('\\n') }}{% endgeneration %}"""),
        ("""{{- '<|im_start|>' + message.role + '\\n' + content }}""",
         """{{- '<|im_start|>' + message.role + '\\n' }}{% generation %}{{- content }}{% endgeneration %}"""),
        ("""        {%- endif %}\n        {{- '<|im_end|>\\n' }}""",
         """        {%- endif %}\n        {% generation %}{{- '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}""")]:
    assert _old in QWEN3_MARKED, _old
    QWEN3_MARKED = QWEN3_MARKED.replace(_old, _new)
QWEN3_ADDED = ["<tool_response>", "</tool_response>", "<think>", "</think>"]
QWEN3_RECORDS = [
    [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "<think>\nr1\n</think>\n\na1"},
     {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
    [{"role": "system", "content": "Think first."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "\n\nfour", "reasoning_content": "\n2 and 2 make 4\n\n"}],
    [{"role": "user", "content": "weather?"},
     {"role": "assistant", "content": "<think>\nI should look\n</think>\n\nlooking", "reasoning_content": None},
     {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "warm"},
     {"role": "assistant", "content": "<think>\nboth say fine\n</think>fine"}, {"role": "user", "content": "thanks"},
     {"role": "assistant", "content": "welcome"}],
    [{"role": "user", "content": "plan"}, {"role": "assistant", "content": "<think>plan it</think>\n\ncalling"},
     {"role": "user", "content": "<tool_response>\n42\n</tool_response>"},
     {"role": "assistant", "content": "no reasoning here"}, {"role": "assistant", "content": "x<think>a</think>b</think>c"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "kept as given", "reasoning_content": "dropped"},
     {"role": "user", "content": "b"}, {"role": "assistant", "content": "<think>\n<think>twice\n</think>\n\nlast"}],
    [{"role": "system", "content": "s"}, {"role": "assistant", "content": "<think>\nno user\n</think>\n\nalone"}],
]
# chatml templates (the fixture's) whose default system message needs Jinja's escapes undone.
_CHATML_DEFAULT = "'<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n'"
DEFAULT_SYSTEMS = {  # name: the literal that writes the default system message
    "boxed": "'<|im_start|>system\\nPlease reason step by step, and put your final answer within \\\\boxed{}.<|im_end|>\\n'",
    "newline": "'<|im_start|>system\\nYou are a helpful assistant.\\nAnswer briefly.<|im_end|>\\n'",
    "apostrophe": "'<|im_start|>system\\nYou\\'re a helpful assistant.<|im_end|>\\n'",
    "double_quoted": '"<|im_start|>system\\nSay \\"caf\\u00e9\\" + {{ ok }}\\x21<|im_end|>\\n"',
}
CHAT_RECORDS = [[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
                [{"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"}]]


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


def chat_rows(tok, records, marked=None):
    """Each conversation's ids and labels from apply_chat_template; with `marked` (the same template
    with generation marks), its ids must be the same and its assistant mask gives the labels."""
    rows = []
    for messages in records:
        ids = list(tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
        out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                                      chat_template=marked)
        assert list(out["input_ids"]) == ids, messages
        labels = [i if m else -100 for i, m in zip(ids, out["assistant_masks"])]
        labels[0] = -100
        rows.append({"messages": messages, "ids": ids, "labels": labels,
                     "text": tok.apply_chat_template(messages, tokenize=False)})
    return rows


def cmd_templates(args):
    from transformers import AutoTokenizer
    out = args.out
    d = os.path.join(out, "qwen3")
    os.makedirs(d, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(os.path.join(TOKENIZERS, "qwen2"))
    tok.add_tokens(QWEN3_ADDED)
    tok.eos_token = "<|im_end|>"
    tok.save_pretrained(d)
    for extra in os.listdir(d):
        if extra not in ("tokenizer.json", "tokenizer_config.json"):
            os.remove(os.path.join(d, extra))
    with open(os.path.join(d, "tokenizer_config.json")) as f:
        config = json.load(f)
    config["chat_template"] = QWEN3
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    tok = AutoTokenizer.from_pretrained(d)
    cases = [{"name": "qwen3", "dir": "qwen3", "records": chat_rows(tok, QWEN3_RECORDS, QWEN3_MARKED)}]
    base = AutoTokenizer.from_pretrained(os.path.join(out, "chatml"))
    for name, literal in DEFAULT_SYSTEMS.items():
        assert _CHATML_DEFAULT in CHATML
        base.chat_template = CHATML.replace(_CHATML_DEFAULT, literal)
        cases.append({"name": name, "dir": "chatml", "template": base.chat_template,
                      "records": chat_rows(base, CHAT_RECORDS)})
    # A chatml template that writes the BOS first (Hermes 2 Pro's, InternLM2's), with a BOS set.
    base.chat_template, base.bos_token = "{{ bos_token }}" + CHATML, "<|endoftext|>"
    cases.append({"name": "bos_first", "dir": "chatml", "template": base.chat_template, "bos_token": base.bos_token,
                  "records": chat_rows(base, CHAT_RECORDS)})
    with open(os.path.join(out, "templates.json"), "w") as f:
        json.dump({"cases": cases}, f, indent=1, ensure_ascii=False)
    for c in cases:
        print(f"{c['name']}: {c['records'][0]['text']!r}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    fx = sub.add_parser("fixture")
    fx.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "chat"))
    tp = sub.add_parser("templates")
    tp.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "chat"))
    args = ap.parse_args()
    if args.cmd == "fixture":
        shutil.rmtree(args.out, ignore_errors=True)
        cmd_fixture(args)
    cmd_templates(args)


if __name__ == "__main__":
    main()
