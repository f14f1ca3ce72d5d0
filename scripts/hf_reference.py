#!/usr/bin/env python3
"""Hugging Face (transformers) reference for weft's HF interop: fixtures, and a check of the export.

Run it through scripts/hf_reference.sh, which makes the venv (torch, transformers, tokenizers,
safetensors, numpy from PyPI). A developer tool: never part of meson test or CI.

  fixtures [--out tests/data/hf] [--only NAME...]
      Writes six tiny checkpoints, deterministically (seeded; CPU):
        gpt2/   GPT2LMHeadModel, 2 layers, n_embd 32, 2 heads, ctx 64, vocab 256, gelu_new,
                tied embeddings; one model.safetensors.
        llama/  LlamaForCausalLM, 2 layers, hidden 64, 4 heads, 2 KV heads (GQA), ffn 64,
                RMSNorm eps 1e-5, RoPE theta 1e4, untied head, no biases; sharded into
                model-0000i-of-0000N.safetensors + model.safetensors.index.json.
        llama3/ LlamaForCausalLM as Llama 3.x is made (make_llama3): rope_theta 5e5, rope_scaling
                llama3 with an original context of 64, head_dim 32 != 64 / 4 heads, 2 KV heads,
                eps 1e-6, a tied head; stored in bf16; one sequence of 81 and a prompt of 40
                bytes, so that logits and generation reach past the original context; also
                logits_linear, logits_dynamic, logits_unscaled [1,16,256]: the last 16
                positions' logits with rope_scaling linear (factor 4), dynamic (factor 4) and
                none.
        mistral/ MistralForCausalLM, sliding_window 48 over 128 positions, rope_theta 1e6; bf16.
        qwen2/  Qwen2ForCausalLM, perturbed q/k/v biases, rope_theta 1e6, eps 1e-6, tied head.
        qwen3/  Qwen3ForCausalLM, perturbed q_norm/k_norm, head_dim 16 != 32 / 4, tied head.
      Default init, plus small noise on every LayerNorm/RMSNorm weight and every bias, so that a
      weight mapped to the wrong place shows. Beside each, expected.safetensors holds
        ids [2,S] int64 (S = 17; 81 for llama3), logits [2,S-1,256] f32 = model(ids[:, :-1]).logits,
        loss [1] f32 = mean cross-entropy of logits against ids[:, 1:],
        loss_after_step [1] f32 = that loss after one AdamW step (lr 1e-2, betas (0.9, 0.999),
                eps 1e-8, weight decay 0) on it, from the saved weights,
        prompt_ids [8] int64 = the bytes of "Hello, w" (llama3: 40 bytes),
        greedy_ids [32] int64 = the 32 new ids of greedy generate() from the saved weights,
        greedy_ids_penalty [32] int64 = the same with repetition_penalty 1.3,
      and metadata (lr, made_by, transformers and torch versions).

  (The tokenizer fixtures, tests/data/tokenizers, are scripts/tokenizer_fixtures.py's.)

  check --build BUILD_DIR [--workdir DIR]
      For gpt2 and llama: trains a tiny model with BUILD_DIR/apps/transformer/weft-transformer
      (5 steps on the default text, Debian's fortunes); for llama3, mistral and qwen2 fine-tunes
      the committed fixture (--init-from) as long; exports it with `export-hf`, loads the
      export with AutoModelForCausalLM and compares against weft's `sample`: the prompt's logits
      (max |diff| <= 1e-5 * max(1, max |logit|)), 32 greedy ids from the export, and the same 32
      ids from weft's own checkpoint. Prints a PASS/FAIL table; exits 1 on any failure.
"""
import argparse
import copy
import os
import random
import shlex
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")    # everything here is local; never reach for the hub
try:
    import transformers
    from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                              LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)
    from safetensors import safe_open
    from safetensors.torch import load_file
except ImportError as e:  # pragma: no cover
    sys.exit(f"hf_reference.py: {e}; run it through scripts/hf_reference.sh, which installs "
             "torch transformers tokenizers safetensors numpy into a venv")

transformers.utils.logging.disable_progress_bar()

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 256
ATTN = "eager"          # the attention implementation used everywhere here
LR = 1e-2               # the one AdamW step of loss_after_step
FIXTURE_PROMPT = "Hello, w"
LONG_PROMPT = "Hello, world! A longer prompt, forty byt"
CHECK_PROMPT = "The quick brown fox"
NEW_TOKENS = 32
REPETITION_PENALTY = 1.3  # greedy_ids_penalty


def log(msg=""):
    print(msg, flush=True)


def seed_everything(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def text_ids(text):
    return torch.tensor(list(text.encode("ascii")), dtype=torch.int64)


# ---------------------------------------------------------------------------------------------
# greedy decoding


def hf_greedy(model, prompt_ids, n, repetition_penalty=None):
    """The n new ids of transformers' greedy generate(), never stopping early.

    The model's own generation config may name an eos (Llama's default is 2, a byte here); it is
    cleared so that generate() neither stops at it nor, through min_new_tokens, masks it out of
    the argmax: the result is plain argmax decoding, as weft's `sample --greedy` does, with
    repetition_penalty (a float) applied to the logits of every id in the prompt and the ids so far.
    """
    gc = copy.deepcopy(model.generation_config)
    gc.eos_token_id = None
    gc.bos_token_id = None
    gc.pad_token_id = 0
    gc.do_sample = False
    gc.num_beams = 1
    gc.temperature = None
    gc.top_k = None
    gc.top_p = None
    gc.max_length = None
    gc.max_new_tokens = n
    gc.min_new_tokens = n
    gc.repetition_penalty = repetition_penalty
    x = prompt_ids[None]
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gc)
    new = out[0, x.shape[1]:].clone()
    if new.numel() != n:
        raise RuntimeError(f"generate() returned {new.numel()} new tokens, wanted {n}")
    return new


def argmax_greedy(model, prompt_ids, n):
    """Greedy decoding by hand: the full sequence re-run each step, no KV cache."""
    ids = prompt_ids.clone()
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=ids[None], use_cache=False).logits[0, -1]
            ids = torch.cat([ids, logits.argmax().reshape(1)])
    return ids[prompt_ids.numel():]


# ---------------------------------------------------------------------------------------------
# fixtures


def make_gpt2():
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, summary_first_dropout=0.0, layer_norm_epsilon=1e-5,
                     tie_word_embeddings=True, bos_token_id=None, eos_token_id=None)
    cfg._attn_implementation = ATTN
    model = GPT2LMHeadModel(cfg).float()
    with torch.no_grad():
        for name, p in model.named_parameters():   # the tied head appears once, as wte
            if ".ln_" in name or name.startswith("transformer.ln_f") or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.02)
    return model


def make_llama():
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                      attention_bias=False, mlp_bias=False, hidden_act="silu",
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    cfg._attn_implementation = ATTN
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.add_(torch.randn_like(p) * 0.1)
    return model


def make_llama3():
    """Llama 3.x's features, each away from weft's defaults so that ignoring one fails a test:
    rope_theta 5e5 with rope_scaling llama3 (factor 8, low/high frequency factors 1 and 8, an
    original context of 64 that the fixture's sequences pass: the 16 channel pairs fall in all
    three bands), head_dim 32 != hidden / heads, GQA, rms_norm_eps 1e-6, the head tied to the
    embedding, and the weights stored in bf16 (the expected values come from those bf16 weights
    in f32). Weights drawn with std 0.1 and the embedding scaled by 0.1, so that the context
    rather than the last token decides the greedy ids (a tied random model repeats its input)."""
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=THETA3,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 8.0, "original_max_position_embeddings": 64},
                      tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
                      hidden_act="silu", initializer_range=0.1,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    cfg._attn_implementation = ATTN
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(0.1)
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.add_(torch.randn_like(p) * 0.1)
            p.copy_(p.bfloat16().float())   # what the bf16 file holds
    return model


def make_mistral():
    """Mistral's config (model_type mistral) with a sliding window of 48 over a context of 128:
    weft caps the context at the window, within which the window changes nothing. rope_theta
    1e6, eps 1e-5, 4 heads, 2 KV heads, an untied head; stored in bf16."""
    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                        sliding_window=48, rms_norm_eps=1e-5, rope_theta=1e6, tie_word_embeddings=False,
                        hidden_act="silu", bos_token_id=None, eos_token_id=None, pad_token_id=None)
    cfg._attn_implementation = ATTN
    model = MistralForCausalLM(cfg).float()
    perturb_norms(model, bf16=True)
    return model


def make_qwen2():
    """Qwen2.5's small models' config (model_type qwen2): biases on q, k and v (perturbed, so a
    bias left out or misplaced shows), none on o; rope_theta 1e6, eps 1e-6, a tied head."""
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True, use_sliding_window=False,
                      hidden_act="silu", bos_token_id=None, eos_token_id=None, pad_token_id=None)
    cfg._attn_implementation = ATTN
    model = Qwen2ForCausalLM(cfg).float()
    perturb_norms(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def make_qwen3():
    """Qwen3's config (model_type qwen3): an RMSNorm over each head of q and k (perturbed, as every
    norm here), head_dim 16 != 32 / 4 heads, no biases, rope_theta 1e6, eps 1e-6, a tied head."""
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                      rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True, use_sliding_window=False,
                      attention_bias=False, hidden_act="silu", bos_token_id=None, eos_token_id=None,
                      pad_token_id=None)
    cfg._attn_implementation = ATTN
    model = Qwen3ForCausalLM(cfg).float()
    perturb_norms(model)
    return model


def perturb_norms(model, bf16=False):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):   # every RMSNorm, Qwen3's q_norm and k_norm too
                p.add_(torch.randn_like(p) * 0.1)
            if bf16:
                p.copy_(p.bfloat16().float())   # what the bf16 file holds


# The llama3 fixture's weights under other rope types (rope_scaling as config.json holds it):
# expected.safetensors gets logits_<name> of the same ids for each, at the last 16 positions
# (past the original context; all of them would double the fixture's size).
VARIANT_POSITIONS = 16
THETA3 = 500000.0
ROPE_VARIANTS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},   # within max_position_embeddings: unchanged
    "unscaled": None,
}


def rope_variant_logits(model, ids):
    out = {}
    for name, scaling in ROPE_VARIANTS.items():
        cfg = copy.deepcopy(model.config)
        if hasattr(cfg, "rope_parameters"):   # transformers 5 keeps theta and the type together
            cfg.rope_parameters = dict(scaling or {"rope_type": "default"}, rope_theta=THETA3)
        else:
            cfg.rope_scaling = copy.deepcopy(scaling)
        other = LlamaForCausalLM(cfg).float().eval()
        other.load_state_dict(model.state_dict())
        with torch.no_grad():
            logits = other(input_ids=ids[:, :-1], use_cache=False).logits.float()
        out["logits_" + name] = logits[:, -VARIANT_POSITIONS:].contiguous()
    with torch.no_grad():
        scaled = model(input_ids=ids[:, :-1], use_cache=False).logits[:, -VARIANT_POSITIONS:]
    # Each rope type must show in the logits (or the test comparing them proves nothing), but
    # dynamic, which changes nothing within max_position_embeddings.
    for name in ("linear", "unscaled"):
        if torch.allclose(out["logits_" + name], scaled, rtol=1e-3, atol=1e-3):
            raise RuntimeError(f"llama3: rope type {name} gives the llama3 logits")
    if not torch.equal(out["logits_dynamic"], out["logits_unscaled"]):
        raise RuntimeError("llama3: dynamic scaling changed the logits within max_position_embeddings")
    return out


def lm_loss(model, ids):
    logits = model(input_ids=ids[:, :-1], use_cache=False).logits
    return logits, F.cross_entropy(logits.reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))


def save_model(model, out_dir, max_shard_size=None, dtype=None):
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    if dtype is not None:
        model = copy.deepcopy(model).to(dtype)
    kw = {}
    if max_shard_size is not None:
        kw["max_shard_size"] = max_shard_size
    import inspect
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kw["safe_serialization"] = True    # transformers 4.x; 5.x writes safetensors only
    model.save_pretrained(out_dir, **kw)


def expected_for(model, name, seed, shape=(2, 17), prompt_text=FIXTURE_PROMPT):
    """Tensors of expected.safetensors, computed from model (left untouched)."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, shape, generator=gen, dtype=torch.int64)
    with torch.no_grad():
        logits, loss = lm_loss(model, ids)

    # one AdamW step on a copy, from the same weights
    trained = copy.deepcopy(model)
    trained.train()
    opt = torch.optim.AdamW(trained.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    opt.zero_grad(set_to_none=True)
    _, train_loss = lm_loss(trained, ids)
    if abs(train_loss.item() - loss.item()) > 1e-5 * max(1.0, abs(loss.item())):
        raise RuntimeError(f"{name}: train-mode loss {train_loss.item()} != eval-mode loss "
                           f"{loss.item()} (is some dropout on?)")
    train_loss.backward()
    opt.step()
    trained.eval()
    with torch.no_grad():
        _, loss_after = lm_loss(trained, ids)

    prompt = text_ids(prompt_text)
    greedy = hf_greedy(model, prompt, NEW_TOKENS)
    by_hand = argmax_greedy(model, prompt, NEW_TOKENS)
    if not torch.equal(greedy, by_hand):
        log(f"WARNING {name}: generate() (KV cache) and argmax decoding without a cache differ:\n"
            f"  generate: {greedy.tolist()}\n  by hand:  {by_hand.tolist()}")
    penalised = hf_greedy(model, prompt, NEW_TOKENS, REPETITION_PENALTY)
    variants = rope_variant_logits(model, ids) if name == "llama3" else {}
    return {
        **variants,
        "ids": ids.contiguous(),
        "logits": logits.detach().float().contiguous(),
        "loss": loss.detach().float().reshape(1).contiguous(),
        "loss_after_step": loss_after.detach().float().reshape(1).contiguous(),
        "prompt_ids": prompt.contiguous(),
        "greedy_ids": greedy.to(torch.int64).contiguous(),
        "greedy_ids_penalty": penalised.to(torch.int64).contiguous(),
    }


def write_safetensors(path, tensors, metadata):
    """safetensors.torch.save_file, but byte-for-byte reproducible.

    save_file writes __metadata__ in hash-map order, which changes from run to run; this writes
    the same format (u64 little-endian header length, JSON header padded with spaces to a
    multiple of 8, then the tensors' bytes, little-endian, row-major) with sorted keys, so that
    re-running `fixtures` leaves the committed files unchanged.
    """
    import json
    dtypes = {torch.float32: "F32", torch.int64: "I64"}
    header, blobs, off = {"__metadata__": dict(sorted(metadata.items()))}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        b = t.numpy().astype(t.numpy().dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)
    back = load_file(path)        # read back with the real reader
    for name, t in tensors.items():
        if not torch.equal(back[name], t):
            raise RuntimeError(f"{path}: tensor {name} does not read back equal")


def describe_safetensors(path):
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        rows = []
        for k in f.keys():
            sl = f.get_slice(k)
            rows.append((k, sl.get_dtype(), list(sl.get_shape())))
    return rows, meta


def cmd_fixtures(args):
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    torch.use_deterministic_algorithms(True)
    meta = {"lr": "0.01", "made_by": "scripts/hf_reference.py",
            "transformers": transformers.__version__, "torch": torch.__version__}
    log(f"torch {torch.__version__}, transformers {transformers.__version__}; writing {out}")

    # name, maker, shard size, ids seed, sequence length, prompt, stored dtype
    specs = [("gpt2", make_gpt2, None, 1001, (2, 17), FIXTURE_PROMPT, None),
             ("llama", make_llama, "150KB", 1002, (2, 17), FIXTURE_PROMPT, None),
             # a sequence of 80 and a prompt of 40 + 32 new tokens: past the original context of 64
             ("llama3", make_llama3, None, 1003, (1, 81), LONG_PROMPT, torch.bfloat16),
             ("mistral", make_mistral, None, 1004, (2, 17), FIXTURE_PROMPT, torch.bfloat16),
             ("qwen2", make_qwen2, None, 1005, (2, 17), FIXTURE_PROMPT, None),
             ("qwen3", make_qwen3, None, 1006, (2, 17), FIXTURE_PROMPT, None)]
    for name, make, shard, ids_seed, shape, prompt_text, dtype in specs:
        if args.only and name not in args.only:
            continue
        seed_everything(0)
        model = make()
        model.eval()
        d = os.path.join(out, name)
        save_model(model, d, shard, dtype)
        exp = expected_for(model, name, ids_seed, shape, prompt_text)
        write_safetensors(os.path.join(d, "expected.safetensors"), exp, meta)
        log(f"{name}: loss {exp['loss'].item():.6f}, after one AdamW step "
            f"{exp['loss_after_step'].item():.6f}; greedy after {prompt_text!r}: "
            f"{exp['greedy_ids'].tolist()}")
        # reload what was written and make sure it reproduces the logits
        back = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                    attn_implementation=ATTN).eval()
        with torch.no_grad():
            again = back(input_ids=exp["ids"][:, :-1]).logits
        diff = (again - exp["logits"]).abs().max().item()
        if diff != 0.0:
            raise RuntimeError(f"{name}: reloading {d} changes the logits by {diff}")
        nshards = len([f for f in os.listdir(d) if f.startswith("model") and f.endswith(".safetensors")])
        if name == "llama" and not 2 <= nshards <= 3:
            raise RuntimeError(f"llama: {nshards} shard files, wanted 2 or 3 (change max_shard_size)")

    total = 0
    log("\nfiles written:")
    for root, _, files in sorted(os.walk(out)):
        for fn in sorted(files):
            p = os.path.join(root, fn)
            sz = os.path.getsize(p)
            total += sz
            log(f"  {os.path.relpath(p, REPO) if p.startswith(REPO) else p}: {sz:,} bytes")
    log(f"  total: {total:,} bytes ({total / 1024:.1f} KiB)")
    if total >= 1_500_000:
        log("FAIL: the fixtures should stay under 1.5 MB")
        return 1
    if args.list:
        for root, _, files in sorted(os.walk(out)):
            for fn in sorted(files):
                if fn.endswith(".safetensors"):
                    rows, m = describe_safetensors(os.path.join(root, fn))
                    log(f"\n{os.path.relpath(os.path.join(root, fn), out)}  metadata={m}")
                    for k, dt, sh in rows:
                        log(f"  {k:48s} {dt:5s} {sh}")
    return 0


# ---------------------------------------------------------------------------------------------
# check


class Failed(Exception):
    pass


def run_cmd(argv, what, timeout=1800):
    """Runs argv; on failure raises Failed with the command line, exit code and output tails."""
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    line = shlex.join(argv)
    log(f"$ {line}")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except FileNotFoundError as e:
        raise Failed(f"{what}: cannot run {argv[0]}: {e}")
    except subprocess.TimeoutExpired:
        raise Failed(f"{what}: timed out after {timeout} s\n  command: {line}")
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        def tail(s, n=40):
            lines = (s or "").rstrip().splitlines()
            return "\n".join("    " + l for l in lines[-n:]) or "    (empty)"
        raise Failed(f"{what}: exit code {p.returncode} after {dt:.1f} s\n  command: {line}\n"
                     f"  stderr (last lines):\n{tail(p.stderr)}\n  stdout (last lines):\n"
                     f"{tail(p.stdout, 10)}")
    log(f"  ok ({dt:.1f} s)")
    return p


def parse_ids(stdout, argv):
    lines = [l.strip() for l in stdout.splitlines() if l.strip()]
    if not lines:
        raise Failed(f"no output from {shlex.join(argv)}; wanted the ids on its last line")
    try:
        ids = [int(t) for t in lines[-1].split(",") if t.strip()]
    except ValueError:
        raise Failed(f"the last line of {shlex.join(argv)} is not comma-separated ids: "
                     f"{lines[-1]!r}")
    return ids


def read_weft_logits(path, argv, want_shape):
    if not os.path.exists(path):
        raise Failed(f"{shlex.join(argv)} wrote no {path}")
    try:
        t = load_file(path)
    except Exception as e:
        raise Failed(f"{path} does not read as safetensors: {type(e).__name__}: {e}")
    if "logits" not in t:
        raise Failed(f"{path} has no tensor 'logits' (it has {sorted(t)})")
    w = t["logits"]
    if w.dtype != torch.float32 or list(w.shape) != list(want_shape):
        raise Failed(f"{path}: logits {w.dtype} {list(w.shape)}, wanted torch.float32 "
                     f"{list(want_shape)} (prompt positions x vocabulary)")
    return w


def compare_logits(got, ref):
    """(ok, message): max |got - ref| <= 1e-5 * max(1, max |ref|)."""
    diff = (got - ref).abs()
    mx = diff.max().item()
    tol = 1e-5 * max(1.0, ref.abs().max().item())
    pos = int(diff.max(dim=1).values.argmax())
    return mx <= tol, (f"max abs diff {mx:.3e} (at prompt position {pos}), tolerance {tol:.3e} "
                       f"(max abs logit {ref.abs().max().item():.4f}), "
                       f"mean abs diff {diff.mean().item():.3e}")


def first_diff(a, b, na, nb):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"first difference at new token {i}: {na} {x}, {nb} {y}\n    {na}: {a}\n    {nb}: {b}"
    return f"{na} has {len(a)} ids, {nb} {len(b)}\n    {na}: {a}\n    {nb}: {b}"


# The families `check` fine-tunes from their fixture (tests/data/hf/NAME): the model_type the
# export must have, the context, and the new tokens (prompt + new within the context; llama3's
# past its original context of 64, mistral's within its window of 48).
FROM_FIXTURE = {"llama3": ("llama", 80, 32), "mistral": ("mistral", 48, 24), "qwen2": ("qwen2", 64, 32),
                "qwen3": ("qwen3", 64, 32)}


def check_arch(arch, exe, work, results):
    def rec(what, ok, detail):
        results.append((arch, what, "PASS" if ok else "FAIL", detail))
        log(f"  [{'PASS' if ok else 'FAIL'}] {arch} {what}: {detail}")

    ckpt = os.path.join(work, f"{arch}-ckpt")
    hf = os.path.join(work, f"{arch}-hf")
    for p in (ckpt, hf):          # only what this script made on an earlier run
        if os.path.isdir(p):
            shutil.rmtree(p)
    model_type, ctx, new_tokens = FROM_FIXTURE.get(arch, (arch, 64, NEW_TOKENS))
    if arch in FROM_FIXTURE:    # fine-tuned from the committed fixture of that family
        shape = ["--init-from", os.path.join(REPO, "tests", "data", "hf", arch)]
    else:
        shape = ["--arch", arch, "--n-layer", "2", "--n-head", "4", "--d-model", "64"]
        shape += ["--n-kv-head", "2", "--ffn-dim", "96", "--untie"] if arch == "llama" else []
    log(f"\n=== {arch} ===")
    try:
        run_cmd([exe, "train", *shape, "--ctx", str(ctx), "--steps", "5", "--batch-size", "4",
                 "--checkpoint-dir", ckpt, "--seed", "1"], f"{arch} train")
        rec("train", True, ckpt)
    except Failed as e:
        rec("train", False, str(e))
        return
    try:
        run_cmd([exe, "export-hf", "--from", ckpt, "--out", hf], f"{arch} export-hf")
        if not os.path.isdir(hf):
            raise Failed(f"export-hf exited 0 but wrote no directory {hf}")
        rec("export-hf", True, f"{hf}: {', '.join(sorted(os.listdir(hf)))}")
    except Failed as e:
        rec("export-hf", False, str(e))
        return

    # transformers loads the export, with nothing missing, unexpected or mis-shaped
    import json
    try:
        with open(os.path.join(hf, "config.json")) as f:
            cfg = json.load(f)
        if cfg.get("model_type") != model_type:
            raise Failed(f"{hf}/config.json has model_type {cfg.get('model_type')!r}, wanted {model_type!r}")
        model, info = AutoModelForCausalLM.from_pretrained(
            hf, dtype=torch.float32, attn_implementation=ATTN, output_loading_info=True)
        model = model.float().eval()
        problems = {k: sorted(v) if isinstance(v, set) else v for k, v in info.items() if v}
        nparams = sum(p.numel() for p in model.parameters())
        rec("HF load", not problems,
            f"{type(model).__name__}, {nparams:,} parameters"
            + (f"; loading info: {problems}" if problems else "; no missing/unexpected keys"))
        if problems:
            return
    except Failed as e:
        rec("HF load", False, str(e))
        return
    except Exception as e:
        rec("HF load", False, f"AutoModelForCausalLM.from_pretrained({hf!r}) raised "
            f"{type(e).__name__}: {e}")
        return

    prompt = text_ids(CHECK_PROMPT)
    with torch.no_grad():
        hf_logits = model(input_ids=prompt[None], use_cache=False).logits[0].float()
    hf_ids = hf_greedy(model, prompt, new_tokens).tolist()
    log(f"  transformers greedy ids: {','.join(map(str, hf_ids))}")

    weft_ids, weft_logits = {}, {}
    for src_name, src in (("export", hf), ("checkpoint", ckpt)):
        lout = os.path.join(work, f"{arch}-logits{'' if src_name == 'export' else '-ckpt'}.safetensors")
        if os.path.exists(lout):
            os.remove(lout)
        argv = [exe, "sample", "--from", src, "--prompt", CHECK_PROMPT, "--greedy",
                "--max-new-tokens", str(new_tokens), "--ids", "--logits-out", lout]
        try:
            p = run_cmd(argv, f"{arch} sample --from {src_name}")
            weft_ids[src_name] = parse_ids(p.stdout, argv)
            log(f"  weft ids ({src_name}): {','.join(map(str, weft_ids[src_name]))}")
            weft_logits[src_name] = read_weft_logits(lout, argv, hf_logits.shape)
        except Failed as e:
            rec(f"sample --from {src_name}", False, str(e))

    if "export" in weft_logits:
        ok, msg = compare_logits(weft_logits["export"], hf_logits)
        rec("prompt logits (export vs HF)", ok, msg)
    if "checkpoint" in weft_logits:
        ok, msg = compare_logits(weft_logits["checkpoint"], hf_logits)
        rec("prompt logits (checkpoint vs HF)", ok, msg)
    if "export" in weft_ids:
        ok = weft_ids["export"] == hf_ids
        rec("greedy ids (export vs HF)", ok, f"{new_tokens} ids equal" if ok else
            first_diff(weft_ids["export"], hf_ids, "weft", "HF"))
    if "checkpoint" in weft_ids and "export" in weft_ids:
        ok = weft_ids["checkpoint"] == weft_ids["export"]
        rec("greedy ids (checkpoint vs export)", ok, f"{new_tokens} ids equal" if ok else
            first_diff(weft_ids["checkpoint"], weft_ids["export"], "checkpoint", "export"))


def cmd_check(args):
    exe = os.path.join(args.build, "apps", "transformer", "weft-transformer")
    if not os.path.isfile(exe) or not os.access(exe, os.X_OK):
        log(f"FAIL: no executable {exe}: build it first (meson setup {args.build} && "
            f"ninja -C {args.build})")
        return 1
    exe = os.path.abspath(exe)
    work = os.path.abspath(args.workdir or os.path.join(args.build, "hf-check"))
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    log(f"torch {torch.__version__}, transformers {transformers.__version__}; weft: {exe}; "
        f"work dir: {work}")
    results = []
    for arch in args.arch:
        try:
            check_arch(arch, exe, work, results)
        except Exception as e:   # a bug here must still end in the table
            import traceback
            traceback.print_exc()
            results.append((arch, "(script error)", "FAIL", f"{type(e).__name__}: {e}"))

    log("\n| arch | check | result | detail |\n|------|-------|--------|--------|")
    for arch, what, res, detail in results:
        log(f"| {arch} | {what} | {res} | {detail.splitlines()[0] if detail else ''} |")
    failed = [r for r in results if r[2] != "PASS"]
    archs_with_rows = {r[0] for r in results}
    log(f"\n{len(results) - len(failed)} passed, {len(failed)} failed")
    if failed:
        log("\nfailures in full:")
        for arch, what, _, detail in failed:
            log(f"- {arch} {what}:\n  {detail}")
    return 1 if failed or archs_with_rows != set(args.arch) else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="see the module docstring of scripts/hf_reference.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    fx = sub.add_parser("fixtures", help="write the HF fixtures (default tests/data/hf)")
    fx.add_argument("--out", default=os.path.join(REPO, "tests", "data", "hf"))
    fx.add_argument("--list", action="store_true", help="also list every tensor written")
    fx.add_argument("--only", nargs="+", choices=["gpt2", "llama", "llama3", "mistral", "qwen2", "qwen3"],
                    help="write only these fixtures")
    ck = sub.add_parser("check", help="check weft-transformer's export-hf against transformers")
    ck.add_argument("--build", required=True, help="meson build directory")
    ck.add_argument("--workdir", default=None, help="default: BUILD/hf-check")
    ck.add_argument("--arch", nargs="+", default=["gpt2", "llama", "llama3", "mistral", "qwen2", "qwen3"],
                    choices=["gpt2", "llama", "llama3", "mistral", "qwen2", "qwen3"])
    args = ap.parse_args()
    return {"fixtures": cmd_fixtures, "check": cmd_check}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
